"""The arithmetic of the GPU benchmark (benchmarks.gpu) and its FlexAttention targets
(T9/T10 in benchmarks.check), on synthetic results: no GPU needed."""

import pytest

from benchmarks import check
from benchmarks.gpu import attention_flops, exp_ceiling


def test_exp_ceiling_follows_the_exponential_rate():
    """One exponential per score forward and one backward at X/s against 14 d FLOPs
    per score at P FLOP/s: exp-bound below d = P / (10 X) ~ 25 (H100: P = 989.4e12,
    X = 3.9e12), matmul-bound from d = P / (4 X) ~ 63 on."""
    P, X = 989.4, 3.9
    assert exp_ceiling(16, P, X) == pytest.approx(14 * 16 * X / (2 * P), rel=1e-12)
    # d = 32: forward exp-bound, backward matmul-bound
    t = 1 / X + 10 * 32 / P
    assert exp_ceiling(32, P, X) == pytest.approx(14 * 32 / t / P, rel=1e-12)
    assert exp_ceiling(64, P, X) == 1.0
    assert exp_ceiling(16, P, X, backward=False) == pytest.approx(4 * 16 * X / P, rel=1e-12)


def test_attention_flops_counts_both_products():
    assert attention_flops(10, 20, 16, 4, backward=False) == 4 * 10 * 20 * 16 * 4
    assert attention_flops(10, 20, 16, 4, value_dim=48, backward=False) == \
        2 * 10 * 20 * (16 + 48) * 4
    assert attention_flops(10, 20, 16, 4) == 3.5 * attention_flops(10, 20, 16, 4,
                                                                   backward=False)


def _gpu(frac262, with_1m=True, key="flex"):
    runs = [{"n": 262144, "impl": "flex", "fwdbwd_s": 1.0, "fwdbwd_tflops": 989.4 * frac262,
             "fwdbwd_of_peak": frac262, "fwdbwd_ceiling": 0.44}]
    if with_1m:
        runs.append({"n": 1_000_000, "impl": "flex", "fwdbwd_s": 14.0, "fwdbwd_tflops": 400.0,
                     "fwdbwd_of_peak": 0.4})
    else:
        runs.append({"n": 1_000_000, "impl": "flex", "error": "OutOfMemoryError: ..."})
    return {"available": True, "name": "H100", "peak_tflops_bf16": 989.4,
            "dtypes": {"bfloat16": {key: runs}}}


def test_flex_targets_pass_miss_and_na():
    t9 = {t["id"]: t for t in check._flex_targets(_gpu(0.45))}["T9"]
    assert t9["status"] == "PASS" and "45.0%" in t9["measured"]
    assert {t["id"]: t for t in check._flex_targets(_gpu(0.30))}["T9"]["status"] == "MISS"
    # 1M not measured: a miss even at 45 % (the target asks for the 1M figure)
    t9 = {t["id"]: t for t in check._flex_targets(_gpu(0.45, with_1m=False))}["T9"]
    assert t9["status"] == "MISS" and "OutOfMemoryError" in t9["measured"]
    t10 = {t["id"]: t for t in check._flex_targets(_gpu(0.5, key="position"))}["T10"]
    assert t10["status"] == "PASS"
    none = check._flex_targets({"available": False, "note": "no GPU: cpu"})
    assert [t["status"] for t in none] == ["N/A", "N/A"]
