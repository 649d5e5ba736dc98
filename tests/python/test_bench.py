"""mccl.bench: busbw factors and the exact checker, then short smoke runs on 2 local ranks (the
collectives, overlap, throughput and ddp commands; --device cuda where there is no GPU).

The smoke runs use tiny sizes and few iterations: they check that the tools work and that every
result is exact (#wrong = 0), not how fast anything is. Each runs under a deadline.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from mccl.bench import collectives as C
from mccl.bench import ddp as D
from mccl.bench import report, runtime
from mccl.bench.__main__ import build_parser
from mccl.cluster import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


def bench(*args, deadline=240, **kw):
    """Run ``python -m mccl.bench ARGS`` (driver mode) under a deadline; return (rc, output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-m", "mccl.bench", *args, "--deadline", str(deadline - 30)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=deadline, **kw)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"mccl.bench {' '.join(args)} did not finish within {deadline} s:\n{exc.stdout}") from None
    return proc.returncode, proc.stdout + proc.stderr


def test_busbw_factors_are_nccl_tests():
    # NVIDIA/nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, reducescatter/allgather/alltoall
    # (n-1)/n, broadcast 1.
    for n in (2, 3, 8):
        assert C.COLLECTIVES["all_reduce"].factor(n) == pytest.approx(2 * (n - 1) / n)
        for op in ("all_gather", "reduce_scatter", "all_to_all"):
            assert C.COLLECTIVES[op].factor(n) == pytest.approx((n - 1) / n)
        assert C.COLLECTIVES["broadcast"].factor(n) == 1.0


def test_sizes_and_iterations():
    assert C.parse_size("1K") == 1024 and C.parse_size("256M") == 256 << 20 and C.parse_size("4096") == 4096
    args = build_parser("collectives").parse_args([])
    sizes = C.size_list(args)
    assert sizes[0] == 1024 and sizes[-1] == 256 << 20 and len(sizes) == 19
    assert C.iterations(args, 1024) == 200 and C.iterations(args, 256 << 20) == 5
    assert C.size_list(build_parser("collectives").parse_args(["--sizes", "1,3,64K"])) == [1, 3, 65536]


@pytest.mark.parametrize("command, args, says", [
    ("collectives", ["--sizes", "4x"], "size '4x'"),
    ("collectives", ["--sizes", "-4"], "at least 1 byte"),
    ("collectives", ["--sizes", ""], "give one or more sizes"),
    ("collectives", ["-n", "0"], "-n/--iters: 0: must be 1 or more"),
    ("collectives", ["--min-iters", "0"], "must be 1 or more"),
    ("collectives", ["-f", "1"], "must be 2 or more"),
    ("collectives", ["--goodput", "abc"], "cannot parse rate 'abc'"),
    ("collectives", ["--goodput", "0gbit"], "above 0"),
    ("collectives", ["--threads", "0"], "must be 1 or more"),
    ("collectives", ["--nproc", "-1"], "must be 1 or more"),
    ("collectives", ["--cluster", "BAD"], "must be 1-4 lowercase letters or digits"),
    ("collectives", ["--rank-order", "random"], "expected in-order, interleave, shuffle or shuffle:SEED"),
    ("ddp", ["--rank-order", "shuffle:x"], "expected in-order, interleave, shuffle or shuffle:SEED"),
    ("overlap", ["--steps", "0"], "must be 1 or more"),
    ("overlap", ["--buckets", "0"], "must be 1 or more"),
    ("overlap", ["--bucket-mb", "0"], "above 0"),
    ("overlap", ["--compute-ms", "-5"], "above 0"),
    ("overlap", ["--matmul", "0"], "must be 1 or more"),
    ("overlap", ["--warmup-steps", "-1"], "must be 0 or more"),
    ("throughput", ["--batch", "0"], "must be 1 or more"),
    ("throughput", ["--world-sizes", "-1"], "-1: a world size here is 1 or more"),
    ("throughput", ["--world-sizes", "0,1"], "0: a world size here is 1 or more"),
    ("collectives", ["--json", "/proc/no-such-dir/x.json"], "cannot write a file in /proc/no-such-dir"),
    ("collectives", ["--plot", "/proc"], "is a folder"),
    ("ddp", ["--json", "/proc/x.json"], "cannot write a file in /proc"),
    ("overlap", ["--plot", "/proc/x.png"], "cannot write a file in /proc"),
    ("throughput", ["--json", "/proc/x.json"], "cannot write a file in /proc"),
])
def test_bad_arguments_are_refused_when_parsed(command, args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(command).parse_args(args)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_unknown_backend_is_named_before_any_rank_starts():
    rc, out = bench("--nproc", "2", "--backends", "mccl,foo", "--sizes", "1K")
    assert rc != 0 and "foo is not a torch.distributed backend here" in out and "Traceback" not in out, out[-3000:]
    assert "[rank" not in out, out[-3000:]  # refused by the driver: no rank ran


@pytest.mark.parametrize("args, says", [
    (["--ops", "bogus"], "--ops: unknown collective 'bogus'"),
    (["-b", "1M", "-e", "1K"], "-b/--minbytes 1048576 is above -e/--maxbytes 1024"),
    (["--ops", "broadcast", "--sizes", "1K", "--root", "2"], "--root 2: a world of 2 has ranks 0 to 1"),
    (["--sizes", "1K", "--skew-ms", "5", "--skew-rank", "7"], "--skew-rank 7: a world of 2 has ranks 0 to 1"),
])
def test_arguments_no_rank_could_run_are_refused_by_the_driver(args, says):
    rc, out = bench("--nproc", "2", "--backends", "mccl", *args, deadline=60)
    assert rc == 2 and says in out and "Traceback" not in out, out[-3000:]
    assert "[rank" not in out, out[-3000:]  # refused before any rank started


def test_rank_order_without_a_cluster_is_one_line_exit_2():
    """--rank-order places ranks on a cluster's hosts (mccl.cluster's own placement); on loopback
    there are no hosts, so anything but in-order is refused before a rank starts."""
    rc, out = bench("--nproc", "2", "--rank-order", "shuffle:1", "--sizes", "1K", deadline=60)
    assert rc == 2 and "rank order 'shuffle:1' needs a cluster" in out and "Traceback" not in out, out[-3000:]
    assert "[rank" not in out, out[-3000:]


def test_placement_lines_name_every_rank_and_its_switch():
    meta = {"placement": {"rank_order": "shuffle:1", "hosts": [3, 0, 2, 1], "switches": [1, 0, 1, 0]},
            "cluster": {"switches": 2}}
    assert runtime.placement_line(meta) == ("# ranks: rank order shuffle:1: rank 0: h3 (switch 1), rank 1: h0 "
                                            "(switch 0), rank 2: h2 (switch 1), rank 3: h1 (switch 0)")
    one = {"placement": {"rank_order": "in-order", "hosts": [0, 1], "switches": [0, 0]}, "cluster": {"switches": 1}}
    assert runtime.placement_line(one) == "# ranks: rank order in-order: rank 0: h0, rank 1: h1"
    assert runtime.placement_line({"placement": None}) is None and runtime.uplink_goodput_line({}) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.uint8])
@pytest.mark.parametrize("n", [2, 5, 16])
def test_pattern_sums_are_exact(dtype, n):
    m = C.pattern_modulus(dtype, n, reduces=True)
    assert m >= 2 and n * (m - 1) <= C.EXACT_LIMIT[dtype]
    big = sum(C.pattern(s, 0, 4096, m, torch.float64) for s in range(n))
    assert torch.equal(big.to(dtype).to(torch.float64), big)  # the sum survives the dtype exactly


@pytest.mark.parametrize("op", OPS)
def test_checker_counts_every_wrong_element(op):
    """Build each rank's exact output from the expectation, then corrupt elements: the checker
    must count exactly those (this is what the smoke runs' #wrong = 0 relies on)."""
    coll, n, count, root, redop = C.COLLECTIVES[op], 3, 3 * 1000, 1, "sum"
    m = C.pattern_modulus(torch.float32, n, coll.reduces)
    for rank in range(n):
        n_in, n_out = coll.shapes(count, n)
        out = torch.empty(n_out or n_in)
        for off, length, sources in coll.expected(rank, n, count, root):
            want = sum(C.pattern(s, so, length, m, torch.float64) for s, so in sources)
            out[off:off + length] = want.to(torch.float32)
        assert C.count_wrong(coll, out, rank, n, count, root, redop, m) == 0
        out[7] += 1
        out[-1] = -5
        assert C.count_wrong(coll, out, rank, n, count, root, redop, m) == 2


def test_smoke_two_ranks_mccl_and_gloo(tmp_path):
    """The acceptance smoke run: every collective, both backends, tiny sizes, goodput measured in
    the run, a skewed rank; the table has no #wrong, JSON and plot are written."""
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc, out = bench("--nproc", "2", "--backends", "mccl,gloo", "-b", "1K", "-e", "256K", "-f", "16", "-n", "3",
                    "-w", "1", "--goodput", "measure", "--goodput-seconds", "0.5", "--skew-ms", "2",
                    "--json", str(out_json), "--plot", str(out_png))
    assert rc == 0, out[-4000:]
    assert "# #wrong total: 0 OK" in out, out[-4000:]
    data = json.loads(out_json.read_text())
    rows = data["results"]
    assert {(r["op"], r["backend"]) for r in rows} == {(o, b) for o in OPS for b in ("mccl", "gloo")}
    assert len({r["size"] for r in rows if r["op"] == "all_reduce"}) == 3  # 1K, 16K, 256K
    for r in rows:
        assert "error" not in r, r
        assert r["wrong"] == 0 and r["iters"] == 3 and r["busbw"] > 0 and r["time_us"] > 0, r
        assert r["busbw_pct_goodput"] > 0 and r["rss_peak_mib"] > 0 and r["cpu_proc_pct"] >= 0, r
        assert r["skew_ms"] == 2 and r["skew_rank"] == 1
        # nccl-tests' loop figure: the slowest rank's loop over the iterations, never above the
        # mean of the per-iteration maxima (a sum of maxima bounds the maximum of sums).
        times = r["per_rank"]["times_us"]
        assert len(times) == 2 and all(len(t) == 3 for t in times), times
        assert r["time_us_loop"] == pytest.approx(max(sum(t) for t in times) / 3, rel=1e-3)
        # What grew, per rank: [mapping, KiB] pairs from smaps, largest first.
        grown = r["per_rank"]["rss_grown"]
        assert len(grown) == 2 and all(isinstance(g, list) for g in grown), grown
        assert all(k.split(" ", 1)[1] and kib >= 4 for g in grown for k, kib in g), grown
        assert all([kib for _, kib in g] == sorted((kib for _, kib in g), reverse=True) for g in grown), grown
        assert 0 < r["time_us_loop"] <= r["time_us_mean"] * (1 + 1e-6), r
    assert data["meta"]["goodput"]["bits_per_s"] > 0 and data["meta"]["world_size"] == 2
    # What moving the goodput stream cost its two ends, and the footnote that reads it against the engines.
    gp = data["meta"]["goodput"]
    assert 0 < gp["sender_cpu_pct"] < 400 and 0 < gp["receiver_cpu_pct"] < 400, gp
    assert f"a rank that sends and receives at that rate pays at least about " \
           f"{gp['sender_cpu_pct'] + gp['receiver_cpu_pct']:.0f}%" in out, out[-4000:]
    assert "mccl" in data["meta"]["cpu_source"] and "gloo" in data["meta"]["cpu_source"]
    assert out_png.stat().st_size > 10_000


def test_combine_rounds_takes_the_median_round_and_its_spread():
    rows = [{"op": "all_reduce", "size": 4, "backend": b, "time_us": t, "busbw": 1 / t, "wrong": w, "round": k}
            for k, (b, t, w) in enumerate([("mccl", 30.0, 0), ("mccl", 10.0, 0), ("mccl", 20.0, 1),
                                           ("gloo", 8.0, 0), ("gloo", 4.0, 0)])]
    rows.append({"op": "all_reduce", "size": 8, "backend": "gloo", "unsupported": "no", "round": 0})
    out = {(r["size"], r["backend"]): r for r in C.combine_rounds(rows)}
    m = out[(4, "mccl")]
    assert m["time_us"] == 20.0 and m["busbw"] == 1 / 20.0 and m["wrong"] == 1  # every round's wrong counts
    assert m["rounds_time_us"] == [30.0, 10.0, 20.0] and m["spread_pct"] == 100.0 and "round" not in m
    g = out[(4, "gloo")]
    assert g["time_us"] == 4.0 and g["spread_pct"] == 100.0  # lower median of two
    assert "unsupported" in out[(8, "gloo")]


def test_rounds_alternate_backends_in_one_run(tmp_path):
    out_json = tmp_path / "r.json"
    rc, out = bench("--nproc", "2", "--backends", "mccl,gloo", "--ops", "all_reduce", "--sizes", "4K", "-n", "2",
                    "-w", "1", "--rounds", "3", "--json", str(out_json))
    assert rc == 0, out[-4000:]
    data = json.loads(out_json.read_text())
    # Measured in the order mccl, gloo / gloo, mccl / mccl, gloo; one combined row per backend.
    assert [(r["round"], r["backend"]) for r in data["rounds"]] == \
        [(0, "mccl"), (0, "gloo"), (1, "gloo"), (1, "mccl"), (2, "mccl"), (2, "gloo")]
    assert sorted(r["backend"] for r in data["results"]) == ["gloo", "mccl"]
    for r in data["results"]:
        assert len(r["rounds_time_us"]) == 3 and r["time_us"] == sorted(r["rounds_time_us"])[1] and r["wrong"] == 0
        assert len(r["rounds_time_us_loop"]) == 3 and all(t > 0 for t in r["rounds_time_us_loop"])
        assert r["time_us_loop_median"] == sorted(r["rounds_time_us_loop"])[1]
        assert r["rounds_busbw_loop"] == pytest.approx(
            [r["size"] / (t * 1e-6) / 1e9 * r["busbw_factor"] for t in r["rounds_time_us_loop"]], rel=1e-9)
    assert "every round" in out and "loop time" in out and "gloo/mccl" in out


def test_under_torchrun():
    """Rank mode: torchrun starts the ranks, the benchmark only runs them."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "mccl.bench", "--ops",
                           "all_reduce,all_gather", "--sizes", "4K,1M", "-n", "2", "-w", "1", "--dtype", "bfloat16",
                           "--op", "max"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "# #wrong total: 0 OK" in proc.stdout


def test_overlap_smoke(tmp_path):
    out_json = tmp_path / "o.json"
    rc, out = bench("overlap", "--nproc", "2", "--buckets", "3", "--bucket-mb", "1", "--compute-ms", "5",
                    "--steps", "2", "--json", str(out_json), "--plot", str(tmp_path / "o.png"))
    assert rc == 0, out[-4000:]
    data = json.loads(out_json.read_text())
    res, meta = data["results"], data["meta"]
    # The header states what the calibrated compute took on rank 0, next to the target.
    assert meta["compute_ms_calibrated"] > 0 and meta["matmuls_per_bucket"] >= 1, meta
    assert f"{meta['compute_ms_calibrated']:.1f} ms when rank 0 calibrated them (target 5 ms)" in out, out[:2000]
    for b in ("mccl", "gloo"):
        med = res[b]["median_s"]
        assert set(med) == {"compute", "comm", "overlap", "serial"} and all(v > 0 for v in med.values())
        assert res[b]["hidden_pct"] is not None
        # The split of one overlapped step: backward ends inside it, the tail is what follows.
        r = res[b]
        assert r["split_step_s"] in r["steps_s"]["overlap"]
        assert 0 < r["backward_done_s"] <= r["split_step_s"] and 0 <= r["rank_skew_s"] <= r["backward_done_s"]
        assert abs(r["backward_done_s"] + r["overlap_tail_s"] - r["split_step_s"]) < 1e-9
    assert "hidden %" in out and "tail (ms)" in out


def test_throughput_smoke(tmp_path):
    out_json = tmp_path / "t.json"
    rc, out = bench("throughput", "--nproc", "2", "--width", "64", "--depth", "2", "--steps", "2",
                    "--warmup-steps", "1", "--json", str(out_json))
    assert rc == 0, out[-4000:]
    rows = json.loads(out_json.read_text())["results"]
    assert sorted((r["backend"], r["world_size"]) for r in rows) == [("gloo", 1), ("gloo", 2), ("mccl", 1), ("mccl", 2)]
    for r in rows:
        assert r["samples_per_s"] > 0
        assert r["efficiency_pct"] == pytest.approx(100.0) if r["world_size"] == 1 else r["efficiency_pct"] > 0


def test_help_documents_every_command():
    for cmd in ([], ["overlap"], ["throughput"], ["ddp"]):
        rc, out = bench(*cmd, "--help", deadline=60)
        assert rc == 0 and "--backends" in out and "--nproc" in out and "--cluster" in out, out


# ---------------------------------------------------------------------------------------------
# Devices (--device), the ddp command, overlap's --stage-to-cpu
# ---------------------------------------------------------------------------------------------



@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("command", [[], ["overlap"], ["throughput"], ["ddp"]])
def test_device_cuda_without_gpu_is_one_line_exit_2(command):
    rc, out = bench(*command, "--nproc", "2", "--device", "cuda", deadline=60)
    assert rc == 2, out
    assert out.strip().count("\n") == 0 and out.startswith("mccl.bench: error: --device cuda: "), out
    assert "Traceback" not in out and "[rank" not in out, out


def test_device_and_stage_to_cpu_parse():
    for command in ("collectives", "overlap", "throughput", "ddp"):
        assert build_parser(command).parse_args([]).device == "cpu"
        assert build_parser(command).parse_args(["--device", "cuda"]).device == "cuda"
    assert build_parser("overlap").parse_args([]).stage_to_cpu is False
    args = build_parser("overlap").parse_args(["--device", "cuda", "--stage-to-cpu"])
    assert args.stage_to_cpu is True and args.device == "cuda"


@pytest.mark.parametrize("command, args, says", [
    ("collectives", ["--device", "tpu"], "invalid choice: 'tpu'"),
    ("ddp", ["--model", "resnet"], "choose timm:NAME, vit_b16, tiny"),
    ("ddp", ["--model", "timm:"], "needs a model name"),
    ("ddp", ["--steps", "0"], "must be 1 or more"),
    ("ddp", ["--batch", "0"], "must be 1 or more"),
    ("ddp", ["--bucket-mb", "0"], "above 0"),
    ("ddp", ["--lr", "0"], "above 0"),
    ("ddp", ["--step-timeout", "-1"], "at least 0"),
])
def test_device_and_ddp_arguments_are_checked(command, args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(command).parse_args(args)
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.skipif(D.timm_available(), reason="timm is installed here")
def test_ddp_without_timm_defaults_to_the_builtin_vit(capsys):
    assert build_parser("ddp").parse_args([]).model == "vit_b16"
    with pytest.raises(SystemExit):
        build_parser("ddp").parse_args(["--model", "timm:vit_base_patch16_224"])
    assert "timm is not installed here" in capsys.readouterr().err


def test_builtin_vit_b16_has_vit_b16s_parameters():
    with torch.device("meta"):  # shapes only: no memory, no time
        model = D.ViT(D.VIT_SPECS["vit_b16"])
    assert sum(p.numel() for p in model.parameters()) == 86_567_656  # timm's vit_base_patch16_224
    tiny = D.build_model("tiny")
    assert 1e6 < sum(p.numel() for p in tiny.model.parameters()) < 5e6
    assert tiny.model(torch.randn(2, *tiny.input_shape)).shape == (2, tiny.classes)


def test_manual_buckets_are_ddp_like():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (10, 300, 5, 200, 200, 7)]
    buckets = D.grad_buckets(params, cap_bytes=1000)  # 250 floats
    # Reverse order; a bucket closes once it reaches the cap (the crossing tensor stays in it).
    assert [[p.numel() for p in b] for b in buckets] == [[7, 200, 200], [5, 300], [10]]
    assert [p for b in buckets for p in b] == params[::-1]


def test_ddp_variant_names():
    assert D.variant_names("compute,ddp,manual", ["mccl", "gloo"]) == ["compute", "ddp-mccl", "ddp-gloo", "manual"]
    assert D.variant_names("ddp-gloo", ["mccl", "gloo"]) == ["ddp-gloo"]
    for bad in ("ddp-nccl", "foo", "", "manual,manual"):
        with pytest.raises(SystemExit):
            D.variant_names(bad, ["mccl", "gloo"])


def test_ddp_smoke_tiny_cpu(tmp_path):
    """Every variant on 2 ranks: positive times, ratios, the parameter check passed, JSON and plot."""
    out_json, out_png = tmp_path / "d.json", tmp_path / "d.png"
    rc, out = bench("ddp", "--model", "tiny", "--device", "cpu", "--nproc", "2", "--steps", "2", "--warmup-steps",
                    "1", "--batch", "4", "--json", str(out_json), "--plot", str(out_png), deadline=180)
    assert rc == 0, out[-4000:]
    assert "parameters bitwise equal on all 2 ranks after 1 step(s): ddp-mccl, ddp-gloo, manual" in out, out[-4000:]
    data = json.loads(out_json.read_text())
    res, meta = data["results"], data["meta"]
    assert list(res) == ["compute", "ddp-mccl", "ddp-gloo", "manual"]
    for name, r in res.items():
        assert len(r["steps_ms"]) == 2 and all(t > 0 for t in r["steps_ms"]), r
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["samples_per_s"] > 0, r
        assert r["samples_per_s"] == pytest.approx(2 * 4 / (r["median_ms"] / 1e3))
        assert r["params_equal"] is (None if name == "compute" else True), r
    assert data["params_equal"] is True and data["reference"] == "ddp-mccl"
    assert set(data["ratios"]) == {"ddp-gloo/ddp-mccl", "manual/ddp-mccl"} and all(v > 0 for v in data["ratios"].values())
    assert meta["grad_bytes_per_step"] == 4 * meta["params"] and sum(meta["manual_bucket_bytes"]) == meta["grad_bytes_per_step"]
    assert meta["world_size"] == 2 and meta["device"] == "cpu" and meta["model"] == "tiny"
    assert out_png.stat().st_size > 5_000


def test_collectives_and_throughput_accept_device_cpu(tmp_path):
    rc, out = bench("--nproc", "2", "--device", "cpu", "--ops", "all_reduce,broadcast", "--sizes", "4K", "-n", "2",
                    "-w", "1", "--json", str(tmp_path / "c.json"))
    assert rc == 0 and "# #wrong total: 0 OK" in out and "# device: cpu" in out, out[-3000:]
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["meta"]["device_info"]["device"] == "cpu" and all(r["wrong"] == 0 for r in data["results"])
    rc, out = bench("throughput", "--nproc", "2", "--device", "cpu", "--world-sizes", "2", "--width", "32", "--depth",
                    "2", "--steps", "1", "--warmup-steps", "1", "--backends", "mccl", "--json", str(tmp_path / "t.json"))
    assert rc == 0, out[-3000:]
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [(r["device"], r["world_size"]) for r in rows] == [("cpu", 2)] and rows[0]["samples_per_s"] > 0


REFUSING_RANK = r"""
import json, os, random, sys
import torch, torch.distributed as dist
from mccl.bench import collectives as C, runtime
from mccl.bench.__main__ import build_parser
groups = runtime.init_groups(["mccl", "gloo"], 60)
args = build_parser("collectives").parse_args(["-n", "1", "-w", "0"])
real = C.run_op
def run_op(coll, group, *a):
    if coll.name == "reduce_scatter":  # what gloo says for CUDA tensors
        raise RuntimeError("ProcessGroupGloo::reduce_scatter: unsupported device type cuda")
    return real(coll, group, *a)
C.run_op = run_op
rows = [C.measure(C.COLLECTIVES[op], b, groups.by_backend[b], groups, 4096, args, random.Random(0))
        for op in ("reduce_scatter", "all_reduce") for b in ("gloo", "mccl")]
dist.destroy_process_group()
print("ROWS " + json.dumps(rows))
"""


def test_a_refused_collective_is_unsupported_for_gloo_and_an_error_for_mccl(capsys):
    """A backend refusing the call (as gloo refuses reduce-scatter of CUDA tensors) makes the row
    'unsupported', not an error and not a crash; mccl refusing is an error. One rank, in a child."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, "-c", REFUSING_RANK], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(proc.stdout.split("ROWS ", 1)[1])
    gloo_rs, mccl_rs, gloo_ar, mccl_ar = rows
    assert "unsupported device type cuda" in gloo_rs["unsupported"] and "error" not in gloo_rs, gloo_rs
    assert "refused" in mccl_rs["error"] and "unsupported" not in mccl_rs, mccl_rs
    assert gloo_ar["wrong"] == 0 and mccl_ar["wrong"] == 0
    meta = {"world_size": 1, "goodput": None}
    report.print_tables([gloo_rs, mccl_rs], ["mccl", "gloo"], meta)
    text = capsys.readouterr().out
    assert "unsupported" in text and "1 measurements failed" in text
    assert "# unsupported (1 size(s), not counted as failures): gloo refuses reduce_scatter on cpu" in text
