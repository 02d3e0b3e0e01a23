"""Records MLX's quantized layers, nn.quantize and nn.init (mlx 0.32.4, CPU) into
quant.safetensors, which nuvec-nn's tests read: python3 make_quant.py, with mlx installed."""
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

mx.random.seed(4)
out = {}
def put(prefix, module):
    for k, v in tree_flatten(module.parameters()):
        out[f"{prefix}.{k}"] = v

# A linear layer before and after to_quantized, in two modes.
lin = nn.Linear(128, 12)
put("lin", lin)
x = mx.random.normal((2, 3, 128))
out["lin.x"] = x
for mode, gs, bits in [("affine", 32, 8), ("mxfp4", 32, 4)]:
    q = lin.to_quantized(group_size=gs, bits=bits, mode=mode)
    put(f"q_{mode}", q)
    out[f"q_{mode}.y"] = q(x)

# An embedding table quantized: rows and the tied projection.
emb = nn.Embedding(40, 64)
put("emb", emb)
qe = emb.to_quantized(group_size=64, bits=4)
put("qemb", qe)
ids = mx.array([[3, 0, 39], [7, 7, 12]], dtype=mx.int32)
out["qemb.ids"] = ids
out["qemb.rows"] = qe(ids)
h = mx.random.normal((2, 64))
out["qemb.h"] = h
out["qemb.logits"] = qe.as_linear(h)

# nn.quantize over a model, with a predicate that leaves the head alone.
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 64)
        self.layers = [nn.Linear(64, 64), nn.Linear(64, 64, bias=False)]
        self.head = nn.Linear(64, 16)

net = Net()
nn.quantize(net, 64, 4, class_predicate=lambda p, m: hasattr(m, "to_quantized") and p != "head")
put("net", net)

# Initializers after a seed, as the thread's default key sequence draws them.
for i, (name, fn, shape) in enumerate([
    ("normal", lambda a: nn.init.normal(0.5, 2.0)(a), (5, 7)),
    ("uniform", lambda a: nn.init.uniform(-3.0, 1.0)(a), (5, 7)),
    ("glorot_normal", lambda a: nn.init.glorot_normal()(a, gain=2.0), (6, 3, 4)),
    ("glorot_uniform", lambda a: nn.init.glorot_uniform()(a), (8, 5)),
    ("he_normal", lambda a: nn.init.he_normal()(a, mode="fan_out"), (4, 3, 3, 2)),
    ("he_uniform", lambda a: nn.init.he_uniform()(a, gain=0.5), (9, 6)),
]):
    mx.random.seed(100 + i)
    out[f"init.{name}"] = fn(mx.zeros(shape))

mx.eval(out)
mx.save_safetensors("quant.safetensors", out)
print(sorted(out))
