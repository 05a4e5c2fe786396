"""kernel-resources-aot: registers and spills of flashlab's dense kernels compiled for an H100/H200
(sm_90) on a machine with no GPU: Triton compiles ahead of time to a cubin, and cuobjdump (shipped in
Triton's wheel) reports its resources. ``spill_stack_bytes`` is the per-thread local memory that
spilled registers go to; 0 means no spills.

The runtime's specialisation for the benchmark's shapes is mimicked: unit strides and GROUP = 1 become
constants; pointers and the other integers get divisibility-16 hints. The Triton here may differ from
a GPU machine's, so compare variants with each other, not with the GPU's kernel-resources record."""

from __future__ import annotations

import os
import subprocess
import tempfile

from flashlab.bench.suite import Context, Suite

FLOATS = ("qk_scale", "sm_scale", "softcap", "dropout_p")
FP32_POINTERS = ("L", "DELTA")
FLAGS = dict(HAS_MASK=False, MASK_IS_BOOL=False, MASK_ROW_SHARED=False, DROPOUT=False, HAS_WINDOW=False, SOFTCAP=False,
             EVEN_D=True, INPUT_PRECISION="ieee")


def compile_for_sm90(fn, constexprs: dict, num_warps: int, num_stages: int):
    """``fn`` (a @triton.jit kernel) compiled for sm_90 with bf16 tensors, unit strides as constants."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = fn.arg_names
    consts = {k: v for k, v in constexprs.items() if k in names}
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in consts:
            signature[name] = "constexpr"
        elif (len(name) in (3, 4) and name.startswith("s") and name.endswith("d")) or name == "GROUP":
            consts[name], signature[name] = 1, "constexpr"                   # unit stride, GQA group 1
        elif name.isupper() and name not in ("H", "H_KV"):
            signature[name] = "*u8" if name == "MASK" else "*fp32" if name in FP32_POINTERS else "*bf16"
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
        if signature[name].startswith("*") or (signature[name] == "i32" and name != "seed"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in consts.items()},
                       attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def resources(kernel) -> dict:
    """Registers, spill stack and shared memory of a compiled kernel (cuobjdump on its cubin)."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        report = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(item.split(":", 1) for item in next(line for line in report.splitlines() if "REG:" in line).split())
    return {"registers": int(fields["REG"]), "spill_stack_bytes": int(fields["STACK"]),
            "shared_bytes": kernel.metadata.shared}


def variants(kernels, d: int, causal: bool):
    """(name, kernel, constexprs, warps, stages): the dense kernels at their H200 default tiles."""
    forward = dict(FLAGS, IS_CAUSAL=causal, BLOCK_M=128, BLOCK_N=64, BLOCK_D=d)
    dkdv = dict(FLAGS, IS_CAUSAL=causal, BLOCK_M=64, BLOCK_N=64, BLOCK_D=d)
    out = [("forward 128x64", kernels.flash_forward_kernel, forward, 8 if d == 128 else 4, 3)]
    if "FAST_PATH" in kernels.flash_backward_dkdv_kernel.arg_names:
        out += [("dK/dV 64x64, fast path", kernels.flash_backward_dkdv_kernel, dict(dkdv, FAST_PATH=True), 4, 2),
                ("dK/dV 64x64, all checked", kernels.flash_backward_dkdv_kernel, dict(dkdv, FAST_PATH=False), 4, 2)]
    else:
        out += [("dK/dV 64x64", kernels.flash_backward_dkdv_kernel, dkdv, 4, 2)]
    return out + [("dQ 64x64", kernels.flash_backward_dq_kernel, dkdv, 4, 2)]


def run(ctx: Context) -> None:
    import triton

    import flashlab.kernels.dense as kernels
    ctx.record.update(triton_compiled_with=triton.__version__, target="sm_90", rows=[], skipped=[])
    cases = [(64, False)] if ctx.quick else [(d, c) for d in (64, 128) for c in (False, True)]
    for d, causal in cases:
        for name, fn, constexprs, warps, stages in variants(kernels, d, causal)[:1 if ctx.quick else None]:
            if ctx.over():
                ctx.record["skipped"].append({"D": d, "causal": causal, "kernel": name})
                continue
            try:
                row = resources(compile_for_sm90(fn, constexprs, warps, stages))
            except Exception as exc:          # a kernel that does not compile for sm_90 fails on the GPU too
                row = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"}
            ctx.record["rows"].append({"D": d, "causal": causal, "kernel": name, "warps": warps, "stages": stages,
                                       **row})
            ctx.save()
            ctx.log(f"D={d:<4} {'causal' if causal else 'full':7} {name:26} w{warps} s{stages}  "
                    + (row["error"] if "error" in row else
                       f"registers {row['registers']:>3}  spill stack {row['spill_stack_bytes']:>4} B  "
                       f"shared {row['shared_bytes'] // 1024:>3} KiB"))
    if any("error" in r for r in ctx.record["rows"]):
        ctx.record["error"] = "a kernel did not compile for sm_90 (its row says why)"


SUITE = Suite(
    name="kernel-resources-aot",
    summary="registers and spills of the dense kernels compiled for sm_90 without a GPU",
    measures="registers per thread, spill stack and shared memory of the dense forward, dK/dV (fast path and "
             "all checked) and dQ kernels at their default tiles, compiled ahead of time for sm_90 on the host",
    shapes="bf16, D = 64 and 128, causal and full, no mask, no dropout. --quick: the forward at D = 64, full",
    budget_s=300, min_s=20, run=run, needs="any", on_cpu_record=True)
