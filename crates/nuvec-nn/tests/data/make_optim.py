"""Records MLX's optimizers, schedules and clip_grad_norm (mlx 0.32.4, CPU) into optim.safetensors,
which nuvec-nn's tests read: python3 make_optim.py, with mlx installed."""
import mlx.core as mx
import mlx.optimizers as optim

mx.random.seed(0)
params = {"a": mx.random.normal((3, 4)), "b": mx.random.normal((5,))}
steps = 4
grads = [{k: mx.random.normal(v.shape) for k, v in params.items()} for _ in range(steps)]
out = {}
for s, g in enumerate(grads):
    for k, v in g.items():
        out[f"grad.{s}.{k}"] = v
for k, v in params.items():
    out[f"param.{k}"] = v

def linear_cosine():
    return optim.join_schedules([optim.linear_schedule(0.0, 0.1, 2), optim.cosine_decay(0.1, 10)], [2])

configs = {
    "sgd": lambda: optim.SGD(0.1),
    "sgd_momentum": lambda: optim.SGD(0.1, momentum=0.9, weight_decay=0.01, dampening=0.1),
    "sgd_nesterov": lambda: optim.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: optim.Adam(0.01),
    "adam_bc": lambda: optim.Adam(0.01, bias_correction=True),
    "adamw": lambda: optim.AdamW(0.01, weight_decay=0.1),
    "lion": lambda: optim.Lion(0.01, weight_decay=0.1),
    "adam_cosine": lambda: optim.Adam(optim.cosine_decay(0.01, 5)),
    "sgd_join": lambda: optim.SGD(linear_cosine(), momentum=0.5),
    "adafactor": lambda: optim.Adafactor(),
    "adafactor_lr": lambda: optim.Adafactor(0.01, beta_1=0.9, weight_decay=0.1, relative_step=False),
    "adafactor_warm": lambda: optim.Adafactor(warmup_init=True, scale_parameter=False, clip_threshold=0.5),
}
for name, make in configs.items():
    opt = make()
    p = dict(params)
    for s, g in enumerate(grads):
        p = opt.apply_gradients(g, p)
        for k, v in p.items():
            out[f"{name}.{s}.{k}"] = v
schedules = {
    "linear": optim.linear_schedule(0.0, 1.0, 10),
    "cosine": optim.cosine_decay(1.0, 10, 0.1),
    "step": optim.step_decay(1.0, 0.5, 3),
    "exponential": optim.exponential_decay(1.0, 0.9),
    "join": linear_cosine(),
}
for name, f in schedules.items():
    out[f"schedule.{name}"] = mx.array([f(mx.array(s)).item() for s in range(14)], dtype=mx.float32)
g = {"a": grads[0]["a"] * 3, "b": grads[0]["b"].astype(mx.float16)}
for max_norm in [1.0, 100.0]:
    clipped, norm = optim.clip_grad_norm(g, max_norm)
    out[f"clip.{int(max_norm)}.norm"] = norm
    for k, v in clipped.items():
        out[f"clip.{int(max_norm)}.{k}"] = v
out["clip.in.a"], out["clip.in.b"] = g["a"], g["b"]
mx.eval(out)
mx.save_safetensors("optim.safetensors", out)
