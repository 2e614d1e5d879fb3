"""The CUDA-core GEMV's step costs (kernels/cuda_gemv/gemv_steps.py): its M = 1 rule for layers no gemv_m1 bucket serves
(the buckets gemv_m1.STEP_MODEL_SERVES lists among them).

Each family's costs are the time of one step of a tile class {(R, U, LW): c} and a round's fixed part, in one
arbitrary unit (only their ratios choose a tile), fitted by tools/bench/gemv_steps_fit.py to lanes-per-row sweeps
(tools/bench/gemv_dispatch.py --lw-grid --ms 1 --formats w4s,w4z,w8) of commit 21e633a on an H100: the 80 layers of
the model list and 37 layers of other models (Falcon-7B, Yi-34B, Phi-2, Gemma-7B, StableLM-3B, Qwen1.5-14B, GLM-4-9B,
Mistral-Small, Command-R, Llama-3.2 ...). Fitted on the model list alone, the costs chose tiles that took 1.031x /
1.015x / 1.020x the fastest measured tile's time on the 37 others (W4 g128 sym / zero point / W8 per channel,
geometric mean; the dispatch of the day 1.095x / 1.131x / 1.044x there); fitted on all of them, 1.026x / 1.008x /
1.021x over the 95-117 layers. W4 zero-point and offset weights share a family (their per-group parameters); int8
weights of every mode share one. The H200 and other GPUs take the H100's costs: on an H200's own sweep (the 52-70
model-list layers up to 4608x36864 where the CUDA-core GEMV serves) they chose 1.017x / 1.010x / 1.037x the fastest
tile's time there (W4 sym / zero point / W8), the H200's tables 1.069x / 1.086x / 1.046x. The fit reads tiles as
the model runs them, without ZSUM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCosts:
    """Fitted costs of one GPU and weight family: ``step`` {tile class: time of one step}, ``round`` a round's fixed
    part, ``per_log2_ks`` what each doubling of the k-slices adds to a round (their partial sums meet in shared
    memory; 0 for the plain codes' model, whose fit did not need it), in the same arbitrary unit (only their ratios
    choose), and where they came from."""

    step: dict
    round: float
    source: str
    per_log2_ks: float = 0.0

    def cost(self, shape, tile) -> float:
        """The modelled time of ``tile`` (its ``step_class`` and ``KS``) over ``shape`` (its ``rounds`` and ``steps``,
        mixgemm.kernels.cuda_gemv.gemv_steps.tile_shape / wg_simt_tile_shape)."""
        fixed = self.round + self.per_log2_ks * math.log2(tile.KS)
        return shape.rounds * (shape.steps * self.step[tile.step_class] + fixed)

_SOURCE = ("tools/bench/gemv_steps_fit.py over tools/bench/gemv_dispatch.py --lw-grid sweeps on the H100 (M = 1, fp16 "
           "activations; 80 model-list layers and 37 layers of other models)")

H100 = {
    "w4 sym": StepCosts({(2, 1, 8): 0.54, (2, 1, 16): 0.662, (2, 1, 32): 0.8, (2, 2, 8): 1.0, (2, 2, 16): 1.0,
                         (2, 2, 32): 1.05, (4, 1, 8): 0.75, (4, 1, 16): 0.567, (4, 1, 32): 0.72, (4, 2, 8): 0.8,
                         (4, 2, 16): 0.84, (4, 2, 32): 1.0}, 0.3, _SOURCE + ", W4 g128 sym"),
    "w4 params": StepCosts({(2, 1, 8): 0.63, (2, 1, 16): 0.54, (2, 1, 32): 0.8, (2, 2, 8): 1.05, (2, 2, 16): 1.05,
                            (2, 2, 32): 1.05, (4, 1, 8): 0.75, (4, 1, 16): 0.66, (4, 1, 32): 0.8, (4, 2, 8): 0.8,
                            (4, 2, 16): 0.8, (4, 2, 32): 1.0}, 0.3, _SOURCE + ", W4 g128 zero point"),
    "w8": StepCosts({(2, 1, 8): 1.0, (2, 1, 16): 1.0, (2, 1, 32): 0.432, (2, 2, 8): 0.84, (2, 2, 16): 1.0,
                     (2, 2, 32): 0.855, (4, 1, 8): 1.0, (4, 1, 16): 0.476, (4, 1, 32): 0.432, (4, 2, 8): 1.0,
                     (4, 2, 16): 1.0, (4, 2, 32): 1.0}, 0.3, _SOURCE + ", W8 per channel"),
}


def step_family(bits: int, mode: str) -> str:
    """The cost family of a weight: int4 sym, int4 with per-group parameters (zero point, offset), or int8."""
    if bits == 8:
        return "w8"
    return "w4 sym" if mode == "sym" else "w4 params"


def step_costs(gpu_name: str, bits: int, mode: str) -> StepCosts:
    """The fitted step costs for a weight on this GPU (the H100's for every GPU: the only one fitted)."""
    return H100[step_family(bits, mode)]


# The CUDA-core GEMV on wgmma_v1 (a compacted weight's M = 1 call; kernels/cuda_gemv/gemv_steps.py, WgSimtStepTile):
# step costs by tile class (RT, U, PF), a round's fixed part and its part per doubling of KS, per GPU and family (bits,
# mode, activation dtype, groups of 32), fitted by tools/bench/wg_simt_fit.py to tools/bench/gemv_dispatch.py
# --simt-only sweeps (M = 1, the whole grid of 49-57 tiles, each as the dispatcher runs it) of 32 layers: 20 of the
# model list and 12 of other models (Mistral-Nemo, Llama-3.2, Yi-34B, Falcon-7B, Command-R, Phi-3-small shapes), each
# GPU's own sweep. Each layer left out of the fit in turn, the costs fitted on the others chose, by geometric mean, this
# many times the fastest tile's time (H100 / H200): fp16 W4 g128 sym 1.014x / -, W8 per channel 1.028x / -, W4 g128 zero
# point 1.021x / 1.022x; bf16 x (fp16 scales) W4 sym 1.011x / 1.034x, zero point 1.009x / 1.011x, W8 1.015x / 1.009x
# (the rule 1.078x); GGUF's groups of 32, fp16 x, H100 only (the H200 takes these): W4 sym (q4_0) 1.017x, offset (q4_1 /
# Q4_K) 1.028x. int8 at groups of 32 (q8_0) was fitted and not kept (1.055x held out, one layer 2.1x); it and bf16 x at
# groups of 32 take their larger groups' family (kernels.cuda_gemv_wg_simt.host.wg_simt_modelled). They serve where no
# measured bucket does (kernels.cuda_gemv_wg_simt.host.wg_simt_config), and bf16 calls whose fp16-measured tile keeps at
# most half its warps in bf16 (kernels.cuda_gemv_wg_simt._compact_tile); offset weights at larger groups and int8 with a
# zero point keep the rule. Before / after with the zero-point and bf16 costs (tools/bench/dispatch_ab.py, compacted,
# M = 1): H100 0.976x the time on 48 changed model-list cases, 0.924x on 35 cases of 24 other layer shapes; H200 0.950x
# / 0.887x; with the groups-of-32 families (H100) 0.963x on 40 / 0.897x on 20 (docs/kernels/cuda_gemv.md).
_WG_SOURCE = ("tools/bench/wg_simt_fit.py over tools/bench/gemv_dispatch.py --simt-only sweeps on the {gpu} (M = 1, "
              "{act} activations; 20 model-list and 12 other layers), {fmt}")


def _wg_costs(gpu: str, fmt: str, step: dict, rnd: float, per_ks: float, act: str = "fp16") -> StepCosts:
    return StepCosts(step, rnd, _WG_SOURCE.format(gpu=gpu, fmt=fmt, act=act), per_ks)


WG_SIMT = {
    "H100": {
        "w4 sym": _wg_costs("H100", "W4 g128 sym", {(1, 1, 0): 0.63, (1, 1, 1): 0.48, (1, 2, 0): 1.0, (1, 2, 1): 0.64,
                                                    (2, 1, 1): 0.6, (2, 2, 0): 1.0, (2, 2, 1): 1.0, (4, 1, 1): 1.0,
                                                    (4, 2, 0): 1.0}, 1.0, 0.1),
        "w8": _wg_costs("H100", "W8 per channel", {(1, 1, 0): 1.083, (1, 1, 1): 0.444, (1, 2, 0): 0.804,
                                                   (1, 2, 1): 0.782, (2, 1, 1): 1.256, (2, 2, 0): 1.398,
                                                   (2, 2, 1): 0.751, (4, 1, 1): 1.41, (4, 2, 0): 1.483}, 1.0, 0.1),
        "w4 zero_point": _wg_costs("H100", "W4 g128 zero point", {(1, 1, 0): 0.63, (1, 1, 1): 0.6, (1, 2, 0): 1.25,
                                                                  (1, 2, 1): 1.0, (2, 1, 1): 0.96, (2, 2, 0): 1.05,
                                                                  (2, 2, 1): 1.0, (4, 1, 1): 0.997, (4, 2, 0): 5.28},
                                   0.6, 0.1),
        "w4 sym bf16": _wg_costs("H100", "W4 g128 sym", {(1, 1, 0): 1.0, (1, 1, 1): 0.48, (1, 2, 0): 1.25,
                                                         (1, 2, 1): 1.0, (2, 1, 1): 0.48, (2, 2, 0): 1.0,
                                                         (2, 2, 1): 0.8, (4, 1, 1): 0.6, (4, 2, 0): 1.6}, 1.0, 0.1,
                                 "bf16"),
        "w4 zero_point bf16": _wg_costs("H100", "W4 g128 zero point", {(1, 1, 0): 1.08, (1, 1, 1): 0.465,
                                                                       (1, 2, 0): 1.0, (1, 2, 1): 0.782,
                                                                       (2, 1, 1): 1.26, (2, 2, 0): 0.895,
                                                                       (2, 2, 1): 0.675, (4, 1, 1): 0.64,
                                                                       (4, 2, 0): 1.48}, 1.0, 0.1, "bf16"),
        "w8 bf16": _wg_costs("H100", "W8 per channel", {(1, 1, 0): 0.585, (1, 1, 1): 0.549, (1, 2, 0): 1.05,
                                                        (1, 2, 1): 0.625, (2, 1, 1): 1.26, (2, 2, 0): 1.12,
                                                        (2, 2, 1): 0.867, (4, 1, 1): 1.41, (4, 2, 0): 1.48}, 1.0, 0.1,
                             "bf16"),
        "w4 sym g32": _wg_costs("H100", "W4 g32 sym (GGUF q4_0)", {(1, 1, 0): 0.403, (1, 1, 1): 1.26, (1, 2, 0): 0.58,
                                                                 (1, 2, 1): 0.759, (2, 1, 1): 1.01, (2, 2, 0): 0.95,
                                                                 (2, 2, 1): 1.28, (4, 1, 1): 0.482, (4, 2, 0): 0.977},
                                1.0, 0.3),
        "w4 offset g32": _wg_costs("H100", "W4 g32 offset (GGUF q4_1 / Q4_K)", {(1, 1, 0): 1.34, (1, 1, 1): 1.26,
                                                                              (1, 2, 0): 0.609, (1, 2, 1): 0.759,
                                                                              (2, 1, 1): 0.334, (2, 2, 0): 0.905,
                                                                              (2, 2, 1): 1.28, (4, 1, 1): 0.482,
                                                                              (4, 2, 0): 0.977}, 0.3, 0.3),
    },
    "H200": {
        "w4 sym": _wg_costs("H200", "W4 g128 sym", {(1, 1, 0): 0.63, (1, 1, 1): 0.6, (1, 2, 0): 0.8, (1, 2, 1): 1.0,
                                                    (2, 1, 1): 0.6, (2, 2, 0): 1.0, (2, 2, 1): 1.0, (4, 1, 1): 1.0,
                                                    (4, 2, 0): 1.0}, 1.0, 0.1),
        "w8": _wg_costs("H200", "W8 per channel", {(1, 1, 0): 0.585, (1, 1, 1): 1.408, (1, 2, 0): 1.055,
                                                   (1, 2, 1): 0.782, (2, 1, 1): 1.256, (2, 2, 0): 1.118,
                                                   (2, 2, 1): 0.751, (4, 1, 1): 1.41, (4, 2, 0): 1.483}, 1.0, 0.075),
        "w4 zero_point": _wg_costs("H200", "W4 g128 zero point", {(1, 1, 0): 0.504, (1, 1, 1): 0.48, (1, 2, 0): 1.0,
                                                                  (1, 2, 1): 1.0, (2, 1, 1): 0.6, (2, 2, 0): 0.9,
                                                                  (2, 2, 1): 0.8, (4, 1, 1): 0.54, (4, 2, 0): 1.0},
                                   1.6, 0.1),
        "w4 sym bf16": _wg_costs("H200", "W4 g128 sym", {(1, 1, 0): 0.585, (1, 1, 1): 0.528, (1, 2, 0): 1.0,
                                                         (1, 2, 1): 0.782, (2, 1, 1): 1.26, (2, 2, 0): 1.12,
                                                         (2, 2, 1): 0.751, (4, 1, 1): 0.529, (4, 2, 0): 1.48}, 1.0,
                                 0.1, "bf16"),
        "w4 zero_point bf16": _wg_costs("H200", "W4 g128 zero point", {(1, 1, 0): 1.34, (1, 1, 1): 0.323,
                                                                       (1, 2, 0): 0.69, (1, 2, 1): 0.759,
                                                                       (2, 1, 1): 0.461, (2, 2, 0): 0.543,
                                                                       (2, 2, 1): 0.385, (4, 1, 1): 0.283,
                                                                       (4, 2, 0): 0.977}, 0.3, 0.1, "bf16"),
        "w8 bf16": _wg_costs("H200", "W8 per channel", {(1, 1, 0): 0.585, (1, 1, 1): 0.422, (1, 2, 0): 1.05,
                                                        (1, 2, 1): 0.586, (2, 1, 1): 1.26, (2, 2, 0): 1.01,
                                                        (2, 2, 1): 0.6, (4, 1, 1): 1.41, (4, 2, 0): 1.48}, 0.48, 0.1,
                             "bf16"),
    },
}


def wg_simt_family(bits: int, mode: str, act: int = 0, g32: int = 0) -> str | None:
    """WG_SIMT's family name of a weight and activation dtype (act 0 fp16, 1 bf16; g32 groups of 32), None for a
    weight no family can describe (int8 with a zero point or offset)."""
    if bits == 8 and mode == "sym":
        name = "w8"
    elif bits == 4:
        name = f"w4 {mode}"
    else:
        return None
    return name + (" g32" if g32 else "") + (" bf16" if act == 1 else "")


def wg_simt_step_costs(gpu_name: str, bits: int, mode: str, act: int = 0, g32: int = 0) -> StepCosts | None:
    """The fitted costs of the CUDA-core GEMV on wgmma_v1 for a weight and activation dtype on this GPU (the H200's on
    an H200, else the H100's; a family fitted on the H100 only serves the H200 too), None where no family was
    fitted (wg_simt_family)."""
    family = wg_simt_family(bits, mode, act, g32)
    for gpu in ("H200", "H100") if "H200" in gpu_name else ("H100",):
        if family in WG_SIMT[gpu]:
            return WG_SIMT[gpu][family]
    return None
