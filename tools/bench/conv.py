"""Conv benchmark: mixgemm W8A16 / W4A16 conv vs torch fp16 conv2d (cuDNN, channels_last).

Protocol (docs/benchmarking.md, adapted to conv): C copies of the layer -- weights AND input
activation, since a conv's activations are usually larger than its weights -- so that C x (fp16 weight + input
+ output bytes) > 3 x L2; one CUDA graph runs the C calls back to back; median replay time / C. Eager time
(no graph) is the second column. Every method runs on the same shapes in the same process; the ratio to cuDNN
is the result. Correctness is checked first against fp32 cuDNN (TF32 off) on the dequantized weights.

Usage:  PYTHONPATH=src python -m tools.bench.conv [--batches 1 32] [--bits 8 4] [--sweep] [--only NAME]
        [--json out.json] [--budget-s 200]
The harness entry points: ``conv_cases()`` (the layer list) and ``bench_case(case, batch, bits)``.
``resnet50()`` builds a plain-torch ResNet-50 (v1.5: stride on the 3x3); ``resnet50_check()`` quantizes it and
compares with the same network on the dequantized float weights.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mixgemm import quantize_conv_weight
from mixgemm.bench.protocol import capture_graph
from mixgemm.epilogue import clamp_bounds
from mixgemm.formats.weight import QuantConfig
from mixgemm.integrations.hf import dequantized_copy
from mixgemm.nn.conv import QuantConv2d, fit_conv_config, swap_conv2d
from mixgemm.ops.conv import conv_output_size, cuda_conv2d, pick_path


# ---------------------------------------------------------------------------------------------- cases
def conv_cases() -> list[dict]:
    """ResNet-50 stage layers (every distinct conv shape but the stem's 1x1 repeats) and ConvNeXt-T 7x7 dw."""
    c = []

    def add(name, ci, co, k, s, hw, groups=1, pad=None, sweep=False):
        c.append(
            dict(
                name=name,
                ci=ci,
                co=co,
                k=k,
                stride=s,
                pad=k // 2 if pad is None else pad,
                hw=hw,
                groups=groups,
                sweep=sweep,
            )
        )

    add("r50.stem 7x7/2 3-64 @224", 3, 64, 7, 2, 224)
    add("r50.s1 1x1 64-64 @56", 64, 64, 1, 1, 56)
    add("r50.s1 3x3 64-64 @56", 64, 64, 3, 1, 56, sweep=True)
    add("r50.s1 1x1 64-256 @56", 64, 256, 1, 1, 56, sweep=True)
    add("r50.s1 1x1 256-64 @56", 256, 64, 1, 1, 56)
    add("r50.s2 3x3/2 128-128 @56", 128, 128, 3, 2, 56, sweep=True)
    add("r50.s2 3x3 128-128 @28", 128, 128, 3, 1, 28)
    add("r50.s2 1x1 128-512 @28", 128, 512, 1, 1, 28)
    add("r50.s2 1x1/2 256-512 @56 (down)", 256, 512, 1, 2, 56)
    add("r50.s3 3x3/2 256-256 @28", 256, 256, 3, 2, 28)
    add("r50.s3 3x3 256-256 @14", 256, 256, 3, 1, 14, sweep=True)
    add("r50.s3 1x1 1024-256 @14", 1024, 256, 1, 1, 14)
    add("r50.s3 1x1 256-1024 @14", 256, 1024, 1, 1, 14)
    add("r50.s4 3x3/2 512-512 @14", 512, 512, 3, 2, 14)
    add("r50.s4 3x3 512-512 @7", 512, 512, 3, 1, 7, sweep=True)
    add("r50.s4 1x1 512-2048 @7", 512, 2048, 1, 1, 7)
    add("r50.s4 1x1 2048-512 @7", 2048, 512, 1, 1, 7, sweep=True)
    add("cnx.s1 dw7x7 96 @56", 96, 96, 7, 1, 56, groups=96, sweep=True)
    add("cnx.s3 dw7x7 384 @14", 384, 384, 7, 1, 14, groups=384, sweep=True)
    return c


# ---------------------------------------------------------------------------------------------- timing
def _do_bench(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3  # us


def time_calls(fns, eager: bool = True) -> tuple[float, float]:
    """(graph us per call, eager us per call) for a list of C zero-argument callables run back to back."""
    for f in fns:  # warm-up: compiles, layouts, cuDNN algorithm search
        f()
    torch.cuda.synchronize()
    eager = _do_bench(lambda: [f() for f in fns]) / len(fns) if eager else float("nan")
    g = capture_graph(fns)
    graph = _do_bench(g.replay) / len(fns)
    del g
    return graph, eager


def _copies(footprint_bytes: int, cap: int = 256) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(cap, math.ceil(3 * l2 / max(footprint_bytes, 1)) + 1))


def bench_case(
    case: dict,
    batch: int,
    bits_list=(8, 4),
    group_size: int = 128,
    configs=None,
    check: bool = True,
    dev: str = "cuda",
) -> dict:
    """Time one layer: cuDNN fp16 (channels_last) and mixgemm W{bits}A16 for each bits. Returns a row dict.

    configs: optional {bits: [ConvConfig, ...]} to sweep tiles (the best one is reported, plus all timings).
    """
    ci, co, k, s, p, hw, g = (case[n] for n in ("ci", "co", "k", "stride", "pad", "hw", "groups"))
    ho, wo = conv_output_size(hw, hw, (k, k), (s, s), (p, p), (1, 1))
    x_bytes = batch * ci * hw * hw * 2
    o_bytes = batch * co * ho * wo * 2
    w_bytes = co * (ci // g) * k * k * 2
    C = _copies(x_bytes + o_bytes + w_bytes)
    gen = torch.Generator(device=dev).manual_seed(0)
    xs = [
        torch.randn(batch, ci, hw, hw, device=dev, generator=gen).half().to(memory_format=torch.channels_last)
        for _ in range(C)
    ]
    w = torch.randn(co, ci // g, k, k, device=dev, generator=gen) * 0.02
    b = (torch.randn(co, device=dev, generator=gen) * 0.1).half()
    row = dict(case=case["name"], batch=batch, copies=C, M=batch * ho * wo, N=co, K=k * k * ci // g)
    # cuDNN fp16 channels_last on the float weights (C copies)
    wh = [w.half().to(memory_format=torch.channels_last).clone() for _ in range(C)]
    torch.backends.cudnn.benchmark = True
    row["cudnn_us"], row["cudnn_eager_us"] = time_calls(
        [(lambda i=i: F.conv2d(xs[i], wh[i], b, s, p, 1, g)) for i in range(C)]
    )
    lo, hi = clamp_bounds(None)
    for bits in bits_list:
        cfg = fit_conv_config(QuantConfig(bits=bits, group_size=group_size), (co, ci // g, k, k))
        qws = [quantize_conv_weight(w, cfg) for _ in range(1)]
        qws = qws + [qws[0].to("cpu").to(dev) for _ in range(C - 1)]  # distinct copies (own layouts)
        tag = f"w{bits}"
        row[f"{tag}_format"] = f"int{cfg.bits} g{cfg.group_size}"
        if check:
            torch.backends.cudnn.allow_tf32 = False
            ref = F.conv2d(xs[0].float(), qws[0].dequantize(torch.float32).to(dev), b.float(), s, p, 1, g)
            y = cuda_conv2d(xs[0], qws[0], b, (s, s), (p, p), (1, 1), g, lo, hi)
            row[f"{tag}_relerr"] = float((y.float() - ref).norm() / ref.norm())
        # None: what mixgemm.conv2d dispatches to (ops.conv.pick_path); "kernel": the Triton kernel (implicit GEMM,
        # or the depthwise kernel) with its default tiles; then any sweep configs (kernel with those tiles).
        variants = [None, "kernel"] + list((configs or {}).get(bits, []))
        kpath = "dw" if (g > 1 and ci // g == 1) else "igemm"
        row[f"{tag}_auto_path"] = pick_path(xs[0], qws[0], row["M"], (s, s), (p, p), g)
        best = None
        for v in variants:
            cfg_v = None if v in (None, "kernel") else v
            path_v = None if v is None else kpath
            try:
                t, te = time_calls(
                    [
                        (
                            lambda i=i, c=cfg_v, pv=path_v, qws=qws: cuda_conv2d(
                                xs[i], qws[i], b, (s, s), (p, p), (1, 1), g, lo, hi, None, c, pv
                            )
                        )
                        for i in range(C)
                    ],
                    eager=v in (None, "kernel"),
                )
            except Exception as e:  # a sweep config that does not compile / fit: record and go on
                row.setdefault(f"{tag}_errors", []).append(f"{v}: {type(e).__name__}: {str(e)[:120]}")
                continue
            row.setdefault(f"{tag}_sweep", []).append((str(v), round(t, 2)))
            if v is None:
                row[f"{tag}_us"], row[f"{tag}_eager_us"] = t, te
            elif v == "kernel":
                row[f"{tag}_kernel_us"], row[f"{tag}_kernel_eager_us"] = t, te
            if v is not None and (best is None or t < best[0]):
                best = (t, str(v))
        if best:
            row[f"{tag}_best_kernel_us"], row[f"{tag}_best_kernel_cfg"] = best
        row[f"{tag}_ratio"] = row["cudnn_us"] / row[f"{tag}_us"] if f"{tag}_us" in row else float("nan")
        if f"{tag}_kernel_us" in row:
            row[f"{tag}_kernel_ratio"] = row["cudnn_us"] / row[f"{tag}_kernel_us"]
    torch.cuda.empty_cache()
    return row


def sweep_configs(case: dict, batch: int):
    """A few tile candidates around the heuristic, for --sweep (swap_ab: weight as the wgmma register operand)."""
    from mixgemm.kernels.triton_conv_igemm.igemm import ConvConfig, auto_split
    from mixgemm.kernels.triton_dwconv.dwconv import DwConfig

    co, ci, k, s, hw, g = (case[n] for n in ("co", "ci", "k", "stride", "hw", "groups"))
    ci_g = ci // g
    if g > 1 and ci_g == 1:
        v = [
            DwConfig(32, 64, 4),
            DwConfig(64, 64, 4),
            DwConfig(128, 32, 4),
            DwConfig(64, 128, 8),
            DwConfig(16, 128, 4),
            DwConfig(64, 32, 4),
            DwConfig(256, 32, 8),
        ]
        return {8: v, 4: v}
    bk = 64 if ci_g % 64 == 0 else 32 if ci_g % 32 == 0 else None
    if bk is None:
        return {}
    ho = (hw + 2 * case["pad"] - k) // s + 1
    m, kk = batch * ho * ho, k * k * ci_g
    bn_big = 128 if co >= 128 else 64

    def cfg(bm, bn, nw, ns, swap, split=None, bk_=None):
        b_k = bk_ or bk
        sp = auto_split(m, co, kk, bm, bn, b_k, 1, 132) if split is None else split
        return ConvConfig(bm, bn, b_k, sp, nw, ns, swap)

    if m >= 8192:
        out = [
            cfg(128, bn_big, 8, 3, False),
            cfg(128, 64, 4, 4, False),
            cfg(128, bn_big, 4, 3, True),
            cfg(256, 64, 8, 3, True),
            cfg(128, 128, 8, 3, True),
            cfg(64, bn_big, 4, 4, False),
            cfg(128, 64, 4, 4, False, bk_=32),
            cfg(128, 64, 4, 4, True, bk_=32),
        ]
    else:
        out = [
            cfg(64, 64, 4, 4, False),
            cfg(64, 64, 4, 4, True),
            cfg(32, 64, 4, 4, True),
            cfg(16, 64, 4, 4, True),
            cfg(64, 128, 4, 3, True),
            cfg(128, 64, 4, 3, True),
            cfg(32, 128, 4, 4, True),
        ]
    return {8: out, 4: out}


# ---------------------------------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, width, stride=1, down=False):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=False)
        self.downsample = (
            nn.Sequential(nn.Conv2d(inp, width * 4, 1, stride, bias=False), nn.BatchNorm2d(width * 4)) if down else None
        )

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + idt)


class ResNet50(nn.Module):
    """torchvision's resnet50 architecture (v1.5), in plain torch."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, inp = [], 64
        for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            blocks = [Bottleneck(inp, width, stride, down=True)]
            inp = width * 4
            blocks += [Bottleneck(inp, width) for _ in range(n - 1)]
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(seed: int = 0) -> ResNet50:
    """Random-weight ResNet-50 in eval mode; BN statistics randomised so activations stay O(1)."""
    torch.manual_seed(seed)
    net = ResNet50()
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.2, 0.6)
            nn.init.normal_(m.bias, 0.0, 0.05)
            m.running_mean.normal_(0.0, 0.05)
            m.running_var.uniform_(0.8, 1.2)
    return net.eval()


@torch.no_grad()
def fold_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """conv followed by eval-mode bn as one conv with bias (w * g / sqrt(var + eps), b = beta - mean * that scale)."""
    s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    out = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                    conv.groups, bias=True).to(conv.weight.device)
    out.weight.copy_(conv.weight * s[:, None, None, None])
    out.bias.copy_(bn.bias - bn.running_mean * s + (conv.bias * s if conv.bias is not None else 0))
    return out


class DeployedBottleneck(nn.Module):
    """A Bottleneck with its BNs folded into the convs (as inference engines run it): conv1 / conv2 are
    Sequential(conv, ReLU), so that fuse_conv_relu can move each ReLU into its conv's epilogue."""

    def __init__(self, b: Bottleneck):
        super().__init__()
        self.conv1 = nn.Sequential(fold_bn(b.conv1, b.bn1), nn.ReLU())
        self.conv2 = nn.Sequential(fold_bn(b.conv2, b.bn2), nn.ReLU())
        self.conv3 = fold_bn(b.conv3, b.bn3)
        self.downsample = fold_bn(*b.downsample) if b.downsample is not None else None

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        return torch.relu(self.conv3(self.conv2(self.conv1(x))) + idt)


def deployed(net: ResNet50) -> ResNet50:
    """The network with every BN folded into its conv (same function in eval mode); the stem's BN too."""
    net.conv1, net.bn1 = fold_bn(net.conv1, net.bn1), nn.Identity()
    for name in ("layer1", "layer2", "layer3", "layer4"):
        setattr(net, name, nn.Sequential(*[DeployedBottleneck(b) for b in getattr(net, name)]))
    return net


def fuse_conv_relu(qnet: nn.Module) -> int:
    """Each Sequential(QuantConv2d, ReLU) becomes the QuantConv2d with activation "relu" (its epilogue clamps);
    returns how many were fused."""
    n = 0
    for mod in list(qnet.modules()):
        for name, ch in list(mod.named_children()):
            if (isinstance(ch, nn.Sequential) and len(ch) == 2 and isinstance(ch[0], QuantConv2d)
                    and isinstance(ch[1], nn.ReLU) and ch[0].activation is None):
                ch[0].activation = "relu"
                setattr(mod, name, ch[0])
                n += 1
    return n


def quantize_model(net: nn.Module, bits: int, group_size: int = 128) -> tuple[nn.Module, str]:
    """mixgemm.quantize_ (W4A16 / W8A16) on the model, then mixgemm.nn.conv.swap_conv2d on any nn.Conv2d it
    left (quantize_ handles nn.Linear; the conv hook is swap_conv2d until the lead wires it in)."""
    how = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from mixgemm.quantize_api import W4A16, W8A16, quantize_

            prec = W4A16(group_size=group_size) if bits == 4 else W8A16(group_size=group_size)
            rep = quantize_(net, prec)
            how.append(f"quantize_ ({len(rep.replaced)} replaced)")
        except Exception as e:  # not there / other signature: the conv hook alone
            how.append(f"quantize_ unavailable ({type(e).__name__}: {str(e)[:80]})")
        left = sum(type(m) is nn.Conv2d for m in net.modules())
        if left:
            swap_conv2d(net, QuantConfig(bits=bits, group_size=group_size))
            how.append(f"swap_conv2d ({left} convs)")
    return net, " + ".join(how)


@torch.no_grad()
def resnet50_check(bits: int = 4, batch: int = 2, hw: int = 224, dtype=torch.float16, time_it: bool = False):
    """Quantized ResNet-50 (fp16, channels_last, CUDA) vs the dequantized-float network (fp32, TF32 off)."""
    dev = "cuda"
    net = resnet50().to(dev)
    qnet, how = quantize_model(net, bits)
    ref_net = dequantized_copy(qnet).float()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(batch, 3, hw, hw, device=dev, generator=torch.Generator(device=dev).manual_seed(1))
    ref = ref_net(x)
    qnet = qnet.to(dtype).to(memory_format=torch.channels_last)
    y = qnet(x.to(dtype).to(memory_format=torch.channels_last)).float()
    res = dict(
        bits=bits,
        batch=batch,
        how=how,
        rel_err=float((y - ref).norm() / ref.norm()),
        n_quant=sum(isinstance(m, QuantConv2d) for m in qnet.modules()),
        formats=sorted(
            {f"int{m.qconfig.bits}/g{m.qconfig.group_size}" for m in qnet.modules() if isinstance(m, QuantConv2d)}
        ),
    )
    if time_it:
        xin = x.to(dtype).to(memory_format=torch.channels_last)
        fnet = dequantized_copy(qnet).to(dtype).to(memory_format=torch.channels_last)
        res["quant_ms"] = _do_bench(lambda: qnet(xin)) / 1e3
        res["cudnn_fp16_ms"] = _do_bench(lambda: fnet(xin)) / 1e3
    return res


# ---------------------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default=None, help="substring filter on case names")
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--resnet", action="store_true", help="also run the ResNet-50 end-to-end check")
    a = ap.parse_args(argv)
    import triton

    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    print(
        f"# GPU {props.name}, L2 {props.L2_cache_size >> 20} MiB, torch {torch.__version__}, "
        f"triton {triton.__version__}",
        flush=True,
    )
    rows = []
    cases = conv_cases()
    if a.sweep:  # the swept layers first, so that a tight --budget-s still covers them
        cases = [c for c in cases if c.get("sweep")] + [c for c in cases if not c.get("sweep")]
    for case, batch in [(c, b) for c in cases for b in a.batches]:
        if a.only and a.only not in case["name"]:
            continue
        if time.time() - t0 > a.budget_s:
            print(f"# budget exhausted, skipping {case['name']} b{batch}", flush=True)
            continue
        cfgs = sweep_configs(case, batch) if a.sweep and case.get("sweep") else None
        try:
            r = bench_case(case, batch, a.bits, configs=cfgs)
        except Exception as e:
            print(f"# FAILED {case['name']} b{batch}: {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(r)
        line = f"{r['case']:<34} b{batch:<3} cudnn {r['cudnn_us']:8.1f}"
        for bits in a.bits:
            tag = f"w{bits}"
            if f"{tag}_us" in r:
                line += (
                    f" | {tag} {r[f'{tag}_us']:8.1f} x{r[f'{tag}_ratio']:.2f}"
                    f" ({r.get(f'{tag}_auto_path')}) err {r.get(f'{tag}_relerr', 0):.1e}"
                    f" kernel {r.get(f'{tag}_kernel_us', float('nan')):.1f}"
                    f" best {r.get(f'{tag}_best_kernel_us', float('nan')):.1f}"
                )
        print(line, flush=True)
        if a.sweep:
            for bits in a.bits:
                print(
                    f"    w{bits} sweep: {r.get(f'w{bits}_sweep')} {r.get(f'w{bits}_errors', '')}",
                    flush=True,
                )
    if a.resnet:
        for bits in (8, 4):
            try:
                print("# resnet50", resnet50_check(bits=bits, batch=2, time_it=True), flush=True)
            except Exception as e:
                print(f"# resnet50 w{bits} FAILED: {type(e).__name__}: {e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"# done in {time.time() - t0:.0f}s", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
