"""Reading benchmark records: targets, ratios and fits."""

import pytest

from flashlab.bench.analysis import fit_power_law, target_table


def _row(impl, n, mode, ms, extra=None, causal=False):
    return {"impl": impl, "N": n, "D": 64, "causal": causal, "dtype": "torch.bfloat16", "mode": mode, "ms": ms,
            "tflops": 1.0, "extra_bytes": extra}


def test_targets_are_ratios_of_times_in_the_same_record():
    record = {"rows": [_row("flashlab", 4096, "fwd", 1.0), _row("sdpa_flash", 4096, "fwd", 1.4),
                       _row("sdpa_cudnn", 4096, "fwd", 0.8),
                       _row("flashlab", 4096, "fwd+bwd", 4.0, extra=100), _row("sdpa_flash", 4096, "fwd+bwd", 4.2, 95),
                       _row("flashlab", 1024, "fwd", 1.0), _row("sdpa_flash", 1024, "fwd", 0.9),
                       {"impl": "sdpa_cudnn", "N": 4096, "D": 64, "causal": False, "dtype": "torch.bfloat16",
                        "mode": "all", "error": "refused"}]}
    table = {(r["mode"], r["baseline"], r["N"]): r for r in target_table(record)}
    flash, cudnn = table[("fwd", "sdpa_flash", 4096)], table[("fwd", "sdpa_cudnn", 4096)]
    assert flash["ratio"] == pytest.approx(1.4) and flash["met"]
    assert cudnn["ratio"] == pytest.approx(0.8) and not cudnn["met"]
    assert not table[("fwd", "sdpa_flash", 1024)]["met"]                       # 0.9 < 1.0 at short N
    assert table[("fwd+bwd", "sdpa_flash", 4096)]["ratio"] == pytest.approx(1.05)
    assert table[("memory fwd+bwd", "sdpa_flash", 4096)]["met"]                  # 100 / 95 ≤ 1.10
    assert ("fwd+bwd", "sdpa_cudnn", 4096) not in table                         # no cuDNN fwd+bwd row: no verdict


def test_power_law_fit():
    assert fit_power_law([512, 1024, 2048, 4096], [3 * n**1.5 for n in (512, 1024, 2048, 4096)]) == pytest.approx(1.5)
    assert fit_power_law([1, 10, 100], [7, 7, 7]) == pytest.approx(0.0)


def test_sdpa_backend_from_kernel_names():
    from flashlab.bench.analysis import sdpa_backend_from_kernels
    cudnn = ["Memset (Device)", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64"]
    assert sdpa_backend_from_kernels(cudnn) == "cudnn"        # "flash" is in cuDNN's name too
    assert sdpa_backend_from_kernels(["fmha_cutlassF_f32_aligned_64x64_rf_sm80(...)"]) == "efficient"
    assert sdpa_backend_from_kernels(["void pytorch_flash::flash_fwd_kernel<...>"]) == "flash"
    assert sdpa_backend_from_kernels(["ampere_sgemm_128x64_tn", "softmax_warp_forward"]) == "math"


def test_merge_records_refuses_different_machines():
    import pytest

    from flashlab.bench.analysis import merge_records
    a = {"environment": {"gpu": "NVIDIA H200", "torch": "2.11"}, "rows": [{"impl": "flashlab", "N": 512}]}
    b = {"environment": {"gpu": "NVIDIA H200", "torch": "2.11"}, "rows": [{"impl": "flashlab", "N": 2048}]}
    assert [r["N"] for r in merge_records(a, b)["rows"]] == [512, 2048]
    with pytest.raises(ValueError, match="records"):
        merge_records(a, {"environment": {"gpu": "NVIDIA A100", "torch": "2.11"}, "rows": []})


def test_autotune_choices_counts_each_kernel_and_shape():
    from flashlab.bench.analysis import autotune_choices
    log = [{"key": ["forward", "cuda:0", "torch.bfloat16", 64, True, False, False, 1, 512, 512, 512], "chosen": "a"},
           {"key": ["forward", "cuda:0", "torch.float16", 64, True, False, False, 1, 512, 512, 512], "chosen": "b"},
           {"key": ["forward", "cuda:0", "torch.float16", 64, True, False, False, 1, 1024, 1024, 256], "chosen": "a"},
           {"key": ["dq", "cuda:0", "torch.float16", 128, False, False, False, 1, 512, 512, 512], "chosen": "c"}]
    assert autotune_choices({"autotune": log}) == {("forward", 64, True): {"a": 2, "b": 1},
                                                   ("dq", 128, False): {"c": 1}}
    assert autotune_choices({"rows": []}) == {}


def test_tuned_entries_key_each_kernels_unmasked_shapes():
    from flashlab.bench.analysis import tuned_entries
    forward = {"key": ["forward", "cuda:0", "torch.bfloat16", 64, True, False, False, 1, 512, 512, 512],
               "chosen": "a", "ms": {"a": 0.1, "b": 0.2}}
    masked = {"key": ["forward", "cuda:0", "torch.bfloat16", 64, True, True, False, 1, 512, 512, 512],
              "chosen": "b", "ms": {"a": 0.3, "b": 0.2}}
    dq = {"key": ["dq", "cuda:0", "torch.float16", 128, False, False, False, 1, 1024, 1024, 256], "chosen": "c",
          "ms": {"c": 0.5}}
    record = {"autotune": [forward, masked, dq]}
    assert tuned_entries(record) == {(512, 64, True, "torch.bfloat16"): forward}      # the masked run left out
    assert tuned_entries(record, "dq") == {(1024, 128, False, "torch.float16"): dq}
    assert tuned_entries({"rows": []}) == {}
