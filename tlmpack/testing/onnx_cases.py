"""Small ONNX graphs for the frontend's tests: each shows one behaviour. Test support only."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def custom_domain_relu_function(path, with_function: bool = True):
    """``com.example::Relu`` on x; with ``with_function`` the model defines it as a local function
    whose body is Neg (onnxruntime runs the function: -x, not relu(x))."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["h"], domain="com.example", name="custom_relu")
    scale = helper.make_node("Mul", ["h", "two"], ["y"], name="scale")
    two = onnx.numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph([node, scale], "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], initializer=[two])
    functions = []
    if with_function:
        body = helper.make_node("Neg", ["a"], ["b"])
        functions.append(helper.make_function("com.example", "Relu", ["a"], ["b"], [body],
                                              [helper.make_opsetid("", 17)]))
    model = helper.make_model(graph, functions=functions, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, str(path))
    return path


def conv_dropout_with_used_mask(path, use_mask: bool = True):
    """Conv → Dropout whose mask is used (Cast to float, multiplied in): TVM imports the Dropout as
    a tuple that its channels-last conversion cannot pass, so the build must fall back. With
    ``use_mask=False`` the mask is unused and the Dropout is the identity."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Dropout", ["c"], ["d", "mask"], name="dropout"),
        *([helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast")] if use_mask else []),
        helper.make_node("Mul", ["d", "m" if use_mask else "d"], ["p"], name="mul"),
        helper.make_node("Relu", ["p"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "dropmask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])  # a bool mask (opset 12+)
    onnx.save(model, str(path))
    return path


def external_data_mlp(path):
    """A two-layer MLP whose weights live in an external-data file next to the model (``path``'s
    stem + ``.weights``), as exporters write models over 2 GiB; small here."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array((rng.standard_normal((64, 128)) / 8).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((128, 16)) / 11).astype(np.float32), "w2")
    b1 = numpy_helper.from_array((0.1 * rng.standard_normal(128)).astype(np.float32), "b1")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                              initializer=[w1, w2, b1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{Path(path).stem}.weights", size_threshold=0)
    return path


def _external(name: str, shape: tuple[int, ...], location: str, offset: int, nbytes: int):
    """A float TensorProto that points at ``nbytes`` at ``offset`` of ``location``."""
    from onnx import TensorProto

    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def external_data_relu_mlp(path, rows: int, columns: int, batch: int | str = 1, transposed: bool = False) -> int:
    """y = relu(x @ W1) @ W2, x [batch, rows], W1 [rows, columns], W2 [columns, 8] (seeded normal / sqrt
    fan-in; batch a dim_param name for a symbolic one; ``transposed``: W1 stored [columns, rows] and
    read by a ``Gemm(transB=1)``, as exporters write linear layers, which TVM transposes at build
    time), the weights in one external file next to the model (``path``'s stem + ``.weights``),
    written chunk by chunk, never through one protobuf message (which cannot hold 2 GiB): a large
    model's shape, as cheap to write as its bytes. Returns the weights' size in bytes."""
    import onnx
    from onnx import TensorProto, helper

    path = Path(path)
    rng = np.random.default_rng(0)
    location = f"{path.stem}.weights"
    initializers, offset = [], 0
    with open(path.parent / location, "wb") as f:
        for name, shape, scale in (("w1", (columns, rows) if transposed else (rows, columns), rows),
                                   ("w2", (columns, 8), columns)):
            for start in range(0, shape[0], 1024):  # never a whole weight in memory
                chunk = rng.standard_normal((min(1024, shape[0] - start), shape[1]), dtype=np.float32)
                f.write((chunk / np.float32(np.sqrt(scale))).tobytes())
            nbytes = shape[0] * shape[1] * 4
            initializers.append(_external(name, shape, location, offset, nbytes))
            offset += nbytes
    first = (helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1) if transposed
             else helper.make_node("MatMul", ["x", "w1"], ["h"]))
    nodes = [first, helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])], initializer=initializers)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return offset


def bool_and_float16_inputs(path):
    """y = float32(where(keep, x16, -x16)) * scale: a bool and a float16 input, a float32 output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    scale = numpy_helper.from_array(np.linspace(0.5, 2.0, 8, dtype=np.float32), "scale")
    nodes = [helper.make_node("Neg", ["x16"], ["n"]), helper.make_node("Where", ["keep", "x16", "n"], ["w"]),
             helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["w32", "scale"], ["y"])]
    graph = helper.make_graph(nodes, "dtypes", [helper.make_tensor_value_info("x16", TensorProto.FLOAT16, [3, 8]),
                                                helper.make_tensor_value_info("keep", TensorProto.BOOL, [3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])], initializer=[scale])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def tiny_bert(seed: int = 0):
    """A transformers BertModel from a tiny config with seeded random weights (nothing downloaded),
    taking input_ids, attention_mask, token_type_ids and returning (last_hidden_state, pooler_output)."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
                        attn_implementation="eager")
    torch.manual_seed(seed)
    model = BertModel(config).eval()
    with torch.no_grad():  # transformers starts biases at 0 and norm scales at 1: make them live
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.05 * torch.randn_like(p))

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            return_dict=True)
            return out.last_hidden_state, out.pooler_output

    return Wrapped().eval()


def bert_feed(seed: int, batch: int = 2, seq: int = 16) -> dict[str, np.ndarray]:
    """Valid BERT inputs: ids below the vocabulary (100), a 0/1 mask with padding at the end, 0/1 types."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[0, seq - 5:] = 0
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2:] = 1
    return {"input_ids": rng.integers(0, 100, size=(batch, seq)).astype(np.int64), "attention_mask": mask,
            "token_type_ids": types}


def export_tiny_bert(path, dynamo: bool, opset: int):
    """tiny_bert to ONNX with the TorchScript exporter or the dynamo one (fixed shapes)."""
    import torch

    model = tiny_bert()
    feed = bert_feed(0)
    args = tuple(torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    torch.onnx.export(model, args, str(path), input_names=list(feed), dynamo=dynamo, opset_version=opset,
                      output_names=["last_hidden_state", "pooler_output"], **({} if dynamo else {"do_constant_folding": True}))
    return path


def computed_shape_constant(path):
    """y = x + ConstantOfShape(Concat(Shape(x)[0:1], [3]), 1.5): a shape computed at run time the
    way exporters write attention masks (TVM 0.27's ConstantOfShape fails on it unfolded)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array([3], dtype=np.int64), "three")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["rows"], axis=0),
             helper.make_node("Concat", ["rows", "three"], ["shape"], axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=numpy_helper.from_array(np.array([1.5], dtype=np.float32))),
             helper.make_node("Add", ["x", "c"], ["y"])]
    graph = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    return path


def small_torch_cnn(seed: int = 0):
    """A small torch CNN (conv, batch norm, ReLU, max pool, dropout, flatten, linear, softmax) with
    seeded weights and live batch-norm statistics, for exporting at several opsets."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1, groups=2), nn.ReLU(), nn.Dropout(0.3), nn.Flatten(),
                          nn.Linear(16 * 8 * 8, 10), nn.Softmax(dim=1))
    with torch.no_grad():
        bn = model[1]
        bn.running_mean.normal_(0, 0.1)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.normal_(1, 0.1)
        bn.bias.normal_(0, 0.1)
    return model.eval()


def export_small_torch_cnn(path, dynamo: bool, opset: int):
    import torch

    model = small_torch_cnn()
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["probs"], dynamo=dynamo,
                      opset_version=opset)
    return path
