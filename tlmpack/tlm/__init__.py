"""The TLM as a build uses it: the tensor language, the GPT-2 and its shipped weights, masked decoding."""
