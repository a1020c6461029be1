"""bench/x86_profile_ab.py: two builds' per-kernel profiles matched by kernel name, medians over rounds."""

from __future__ import annotations

from bench_scripts import load


def _module():
    return load("x86_profile_ab")


def _round(**kernels: tuple[float, float]) -> dict:
    return {"profile": {"kernels": [{"kernel": name, "mean_us": us, "calls_per_run": calls}
                                    for name, (us, calls) in kernels.items()]}}


def test_kernels_are_matched_without_their_task_number_and_ranked_by_what_they_cost_a_run():
    m = _module()
    a = [_round(k3_conv=(100.0, 2), k4_pool=(10.0, 1), k9_only_a=(5.0, 1)),
         _round(k3_conv=(104.0, 2), k4_pool=(12.0, 1), k9_only_a=(5.0, 1)),
         _round(k3_conv=(300.0, 2), k4_pool=(11.0, 1), k9_only_a=(5.0, 1))]  # an outlier: the median ignores it
    b = [_round(k5_conv=(90.0, 2), k1_pool=(22.0, 1)), _round(k5_conv=(92.0, 2), k1_pool=(22.0, 1)),
         _round(k5_conv=(94.0, 2), k1_pool=(22.0, 1))]
    rows = m.compare(a, b)
    # |(92 - 104) x 2| = 24 > |22 - 11| = 11 > the kernel A alone has, 5
    assert [r["kernel"] for r in rows] == ["conv", "pool", "only_a"]
    conv, pool, only_a = rows
    assert conv["a_us"] == 104.0 and conv["b_us"] == 92.0 and conv["cost_us_per_run"] == -24.0
    assert pool["ratio"] == 2.0 and pool["calls"] == 1
    assert only_a["b_us"] == 0.0 and only_a["ratio"] == 0.0 and only_a["cost_us_per_run"] == -5.0


def test_a_kernel_only_the_second_build_has_costs_all_its_time():
    """A change that splits a kernel in two (a pool summed in parts) adds a kernel: it is listed, not dropped."""
    rows = _module().compare([_round(k2_matmul=(20.0, 1))], [_round(k2_matmul=(12.0, 1), k3_sum=(2.0, 1))])
    by_name = {r["kernel"]: r for r in rows}
    assert by_name["sum"]["a_us"] == 0.0 and by_name["sum"]["ratio"] == float("inf")
    assert by_name["sum"]["cost_us_per_run"] == 2.0 and by_name["matmul"]["cost_us_per_run"] == -8.0


def test_a_name_without_a_task_number_is_kept_whole():
    m = _module()
    assert m.kernel_key("k18_fused_conv2d16_add9") == "fused_conv2d16_add9"
    assert m.kernel_key("kernel_a") == "kernel_a" and m.kernel_key("k7") == "k7"
