"""Records MLX's activations and losses (mlx 0.32.4, CPU) into nn.safetensors, which nuvec-nn's
tests read: python3 make_nn.py, with mlx installed."""
import mlx.core as mx
import mlx.nn as nn
import mlx.nn.losses as L

mx.random.seed(1)
out = {}
x = mx.concatenate([mx.linspace(-8, 8, 33), mx.random.normal((31,)) * 3]).reshape(4, 16)
out["x"] = x
for name in ["relu", "relu6", "relu2", "selu", "gelu", "gelu_approx", "gelu_fast_approx", "silu", "softplus",
             "softsign", "mish", "hardswish", "log_sigmoid"]:
    out[f"act.{name}"] = getattr(nn, name)(x)
out["act.leaky_relu"] = nn.leaky_relu(x, 0.1)
out["act.elu"] = nn.elu(x, 0.5)
out["act.celu"] = nn.celu(x, 0.5)
out["act.hard_tanh"] = nn.hard_tanh(x, -2.0, 3.0)
out["act.hard_shrink"] = nn.hard_shrink(x, 0.5)
out["act.softshrink"] = nn.softshrink(x, 0.5)
alpha = mx.random.uniform(shape=(16,))
out["prelu.alpha"] = alpha
out["act.prelu"] = nn.prelu(x, alpha)
out["act.step"] = nn.step(x, 0.5)
out["act.glu"] = nn.glu(x, -1)
out["act.log_softmax"] = nn.log_softmax(x, -1)
out["act.softmin"] = nn.softmin(x, 0)

logits = mx.random.normal((6, 10)) * 2
labels = mx.random.randint(0, 10, (6,))
probs = mx.softmax(mx.random.normal((6, 10)), -1)
w = mx.random.uniform(shape=(6,))
out["ce.logits"], out["ce.labels"], out["ce.probs"], out["ce.w"] = logits, labels, probs, w
out["ce.plain"] = L.cross_entropy(logits, labels)
out["ce.smooth"] = L.cross_entropy(logits, labels, label_smoothing=0.2, reduction="mean")
out["ce.probs_loss"] = L.cross_entropy(logits, probs, reduction="sum")
out["ce.weighted"] = L.cross_entropy(logits, labels, weights=w, reduction="mean")
out["ce.axis0"] = L.cross_entropy(logits.T, labels, axis=0)
p = mx.random.normal((5, 4))
t = mx.random.normal((5, 4))
tb = mx.random.uniform(shape=(5, 4))
out["reg.p"], out["reg.t"], out["reg.tb"] = p, t, tb
out["reg.l1"] = L.l1_loss(p, t)
out["reg.mse"] = L.mse_loss(p, t, reduction="sum")
out["reg.smooth_l1"] = L.smooth_l1_loss(p, t, beta=0.7, reduction="none")
out["reg.bce_logits"] = L.binary_cross_entropy(p, tb)
out["reg.bce_probs"] = L.binary_cross_entropy(mx.sigmoid(p), tb, weights=tb, with_logits=False, reduction="none")
lp = nn.log_softmax(logits, -1)
lq = nn.log_softmax(mx.random.normal((6, 10)), -1)
out["kl.p"], out["kl.q"] = lp, lq
out["kl.loss"] = L.kl_div_loss(lp, lq, reduction="mean")
out["nll.loss"] = L.nll_loss(lp, labels, reduction="sum")
mx.eval(out)
mx.save_safetensors("nn.safetensors", out)
