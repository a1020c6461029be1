"""The measured dataset: the task corpus, random legal sampling, x86 measurement, the record store
and the collect loop that drives them (``tlmpack tlm collect``)."""
