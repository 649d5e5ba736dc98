"""mccl.model: the cost models, the fit, the paper's crossovers and the command line (no ranks)."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mccl import model
from mccl.model import Params, Point

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench", "results", "device-20261130-162331", "collectives.json")

# Rounds of recursive doubling, counted by hand from csrc/algo/doubling.c (fold in, log2 p, fold out).
ROUNDS = {2: 1, 3: 3, 4: 2, 5: 4, 6: 4, 7: 4, 8: 3, 16: 4, 24: 6}


def write_bench(path, alpha, beta, hosts, sizes, threshold=256 * 1024, extra_rows=()):
    """A mccl.bench JSON file whose times follow the paper's ring and doubling exactly."""
    rows = []
    for n in hosts:
        for S in sizes:
            if S >= threshold:
                t = 2 * (n - 1) * max(alpha, S / n / beta)
            else:
                t = ROUNDS[n] * (alpha + S / beta)
            rows.append({"op": "all_reduce", "backend": "mccl", "size": S, "count": S // 4, "nranks": n,
                         "time_us": t * 1e6, "busbw": S / t * 2 * (n - 1) / n / 1e9})
    rows += list(extra_rows)
    meta = {"world_size": max(hosts), "env": {}, "goodput": {"bits_per_s": beta * 8}}
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": rows}, f)
    return path


SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB


def test_synthetic_fit_recovers_alpha_beta(tmp_path):
    alpha, beta = 57e-6, 0.62e9
    path = write_bench(tmp_path / "b.json", alpha, beta, [3, 4, 8, 16], SIZES, extra_rows=[
        {"op": "all_reduce", "backend": "gloo", "size": 1024, "nranks": 4, "time_us": 1.0},  # other backend
        {"op": "all_gather", "backend": "mccl", "size": 1024, "nranks": 4, "time_us": 1.0},  # other op
        {"op": "all_reduce", "backend": "mccl", "size": 4096, "nranks": 4, "error": "rank 1: boom"},
        {"op": "all_reduce", "backend": "mccl", "size": 4096, "nranks": 4, "time_us": 9e9, "skew_ms": 5.0},
    ])
    pts, goodputs = model.points_from([str(path)])
    assert goodputs == [beta]
    assert len(pts) == 4 * len(SIZES)
    assert {q.algo for q in pts if q.size >= 256 * 1024} == {"ring"}
    for algo in ("ring", "doubling"):
        f = model.fit(pts, algo)
        assert f.alpha_identified
        assert f.params.alpha == pytest.approx(alpha, rel=1e-6)
        assert f.params.beta == pytest.approx(beta, rel=1e-6)
        assert max(abs(f.rel_err)) < 1e-6
    # Some ring points are latency-bound (256 KiB on 16 hosts: 16 KiB chunks, 26 us < 57 us), some not.
    ring = [q for q in pts if q.algo == "ring"]
    assert any(q.size / q.nranks / beta < alpha for q in ring) and any(q.size / q.nranks / beta > alpha for q in ring)


def test_synthetic_fit_with_segment_and_overhead():
    p = Params(40e-6, 1.1e9, segment=256 * 1024, overhead=30e-6)
    pts = [Point(S, n, float(model.ring_time(S, n, p)), "ring") for n in (2, 5, 8, 24) for S in SIZES[3:]]
    pts += [Point(S, n, float(model.doubling_time(S, n, p)), "doubling") for n in (2, 5, 8, 24) for S in SIZES[:4]]
    for algo in ("ring", "doubling"):
        f = model.fit(pts, algo, segment=256 * 1024, overhead=True)
        assert f.params.alpha == pytest.approx(p.alpha, rel=1e-6)
        assert f.params.beta == pytest.approx(p.beta, rel=1e-6)
        assert f.params.overhead == pytest.approx(p.overhead, rel=1e-6)


def test_alpha_not_identified_when_every_point_is_bandwidth_bound():
    p = Params(10e-6, 1e9)
    pts = [Point(S, 8, float(model.ring_time(S, 8, p)), "ring") for S in SIZES[6:]]  # chunks >= 512 KiB
    f = model.fit(pts, "ring")
    assert not f.alpha_identified and f.params.alpha == 0
    assert f.params.beta == pytest.approx(1e9, rel=1e-9)
    assert f.alpha_bound == pytest.approx(SIZES[6] / 8 / 1e9, rel=1e-9)  # the smallest chunk's time


def test_holdout_predicts_exact_data_exactly():
    p = Params(50e-6, 1e9)
    pts = [Point(S, n, float(model.ring_time(S, n, p)), "ring") for n in (4, 8, 16) for S in SIZES[5:]]
    for how in ("point", "size", "hosts"):
        f = model.fit(pts, "ring", holdout=how)
        assert f.holdout is not None and max(abs(f.holdout)) < 1e-6, how
    with pytest.raises(model.ModelError, match="two or more host counts"):
        model.fit([Point(S, 8, 1e-3 + S / 1e9, "doubling") for S in SIZES[:4]], "doubling", overhead=True)


def test_paper_crossovers():
    a, b = model.PAPER_ALPHA_S, model.PAPER_BETA_BPS
    assert (a, b) == (306e-6, 1.238e9)
    for S, hosts in ((25e6, 65.993), (50e6, 131.986), (25 * 2 ** 20, 69.198), (50 * 2 ** 20, 138.397)):
        nstar = model.crossover_hosts(S, model.PAPER)
        assert nstar == S / (a * b)
        assert nstar == pytest.approx(hosts, abs=0.001)
        # Bandwidth-bound (busbw == goodput) up to floor(n*), latency-bound above it.
        n = math.floor(nstar)
        assert float(model.busbw(S, n, model.ring_time(S, n, model.PAPER))) == pytest.approx(b, rel=1e-12)
        above = float(model.busbw(S, n + 1, model.ring_time(S, n + 1, model.PAPER)))
        assert above == pytest.approx(b * nstar / (n + 1), rel=1e-12) and above < b
    # The acceptance ranges and the paper's wording (section 7).
    assert 60 <= model.crossover_hosts(25e6, model.PAPER) <= 75
    assert 120 <= model.crossover_hosts(50e6, model.PAPER) <= 140
    bw100 = float(model.busbw(50e6, 100, model.ring_time(50e6, 100, model.PAPER)))
    assert bw100 == pytest.approx(1.238e9, rel=1e-12)  # "holds 1.23 GB/s at 100 nodes"
    additive = replace_segment(model.PAPER, math.inf)
    assert float(model.busbw(50e6, 100, model.ring_time(50e6, 100, additive))) == pytest.approx(0.704e9, rel=1e-3)
    # MCCL's 256 KiB segments: 3 segments of c/3 from c* = 1.5 alpha*beta up, so n* = S / (1.5 alpha*beta).
    seg = replace_segment(model.PAPER, 256 * 1024)
    assert model.crossover_chunk(seg) == pytest.approx(1.5 * a * b, rel=1e-12)
    assert model.crossover_hosts(25e6, seg) == pytest.approx(25e6 / (1.5 * a * b), rel=1e-12)
    assert round(model.crossover_hosts(25e6, seg)) == 44 and round(model.crossover_hosts(50e6, seg)) == 88


@pytest.mark.parametrize("segment", [0.0, 4096.0, 65536.0, 262144.0, 1 << 20, 3e6])
@pytest.mark.parametrize("alpha", [306e-6, 50e-6, 1e-6])
def test_crossover_separates_bandwidth_from_latency_bound(segment, alpha):
    p = Params(alpha, 1.238e9, segment)
    for S in (25e6, 50e6, 2 ** 30):
        nstar = model.crossover_hosts(S, p)
        below, above = math.ceil(nstar) - 1, math.floor(nstar) + 1  # strictly on either side
        if below >= 2:
            assert float(model.ring_step(S / below, p)) == S / below / p.beta  # bandwidth-bound
        assert float(model.ring_step(S / above, p)) > S / above / p.beta  # latency-bound


def replace_segment(p, segment):
    return Params(p.alpha, p.beta, segment, p.overhead)


@pytest.mark.parametrize("size, n, meta, env, want", [
    # select.c's rule (tests/c/test_select.c checks the same sizes): on 8 ranks doubling below
    # 77 KiB, halving-doubling up to 256 KiB (chunks of alpha x beta), the ring above.
    (64 << 10, 8, 2, {}, "doubling"),
    (80 << 10, 8, 2, {}, "halving"),
    (256 << 10, 8, 2, {}, "halving"),
    (260 << 10, 8, 2, {}, "ring"),
    (256 << 10, 12, 2, {}, "ring"),
    (200 << 10, 3, 2, {}, "doubling"),
    (4 << 20, 3, 2, {"MCCL_ALGO": "halving"}, "halving"),
    (256 << 10, 8, 2, {"MCCL_ALPHA_BETA": "16K"}, "ring"),
    (128 << 10, 8, 2, {"switches": 4}, "doubling"),  # topology groups (switches): not chosen
    # Files from before halving-doubling (no algo_select) keep the old two-way rule.
    (128 << 10, 8, None, {}, "doubling"),
    (256 << 10, 8, None, {}, "ring"),
])
def test_classify_follows_select_c(size, n, meta, env, want):
    cluster = {"switches": env.pop("switches")} if "switches" in env else {"switches": 1}
    m = {"env": env, "cluster": cluster} if meta is None else {"env": env, "cluster": cluster, "algo_select": meta}
    row = {"size": size, "count": size // 4, "nranks": n}
    assert model.classify(row, m) == want


@pytest.mark.parametrize("p", [model.PAPER, Params(50e-6, 0.62e9, 256 * 1024), Params(5e-6, 2e9, math.inf, 1e-5)])
def test_two_level_with_one_group_is_the_flat_ring(p):
    for n in (1, 2, 3, 8, 24, 70, 128, 256):
        for S in (1e3, 25e6, 50e6, 3 * 2 ** 28):
            flat = float(model.ring_time(S, n, p))
            assert model.two_level_time(S, [n], p) == flat
            assert model.two_level_time(S, [1] * n, p) == pytest.approx(flat, rel=1e-12)


def test_two_level_even_groups_by_hand():
    a, b, S = 306e-6, 1.238e9, 25e6
    t = model.two_level_time(S, [16] * 16, model.PAPER)
    assert t == pytest.approx(2 * 15 * (S / 16 / b) + 2 * 15 * a, rel=1e-12)  # intra bandwidth-, inter latency-bound
    # Uneven groups: never faster than the even split of the same hosts into as many groups.
    assert model.two_level_time(S, [16, 8], model.PAPER) >= model.two_level_time(S, [12, 12], model.PAPER)
    # A shared uplink slows only the inter-group phase.
    slow = Params(a, b / 16)
    t_up = model.two_level_time(S, [16] * 16, model.PAPER, slow)
    assert t_up == pytest.approx(2 * 15 * (S / 16 / b) + 2 * 15 * max(a, S / 256 / (b / 16)), rel=1e-12)


def test_doubling_and_groups():
    for n, r in ROUNDS.items():
        assert model.doubling_rounds(n) == r
    p = Params(1e-4, 1e9)
    assert float(model.doubling_time(1e6, 8, p)) == pytest.approx(3 * (1e-4 + 1e-3), rel=1e-12)
    assert model.group_sizes(24, group_size=16) == [12, 12]
    assert model.group_sizes(70, group_size=16) == [14] * 5
    assert model.group_sizes(70, groups=16) == [5] * 6 + [4] * 10
    assert model.group_sizes(8, groups=16) == [1] * 8
    with pytest.raises(model.ModelError):
        model.group_sizes(8, groups=0)
    with pytest.raises(model.ModelError):
        Params(-1.0, 1e9)


def test_predict_cli_paper_table(capsys, tmp_path):
    png = tmp_path / "out.png"
    assert model.main(["predict", "--hosts", "8,24,70,128,256", "--bucket-mb", "25,50", "--alpha-us", "306",
                       "--goodput-gbs", "1.238", "--groups", "16", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "n* = S/(alpha*beta) = 66.0 hosts" in out and "= 132.0 hosts" in out
    rows = {tuple(line.split()[:3]): line for line in out.splitlines() if line.strip().startswith(("25 MB", "50 MB"))}
    assert len(rows) == 10
    # 25 MB on 256 hosts: flat ring 2*255*306 us = 156.06 ms, 25.8% of goodput.
    assert "156.06   0.319   25.8%" in rows[("25", "MB", "256")]
    assert rows[("50", "MB", "128")].split()[5:8] == ["80.14", "1.238", "100.0%"]
    # Halving-doubling on 256 hosts: 2 x 8 rounds of 306 us + 2 x 255/256 x 25 MB at 1.238 GB/s =
    # 4.896 + 40.233 ms; on 24 (P = 16, folded): (8 + 2) x 306 us + (2 x 15/16 + 2) x 25 MB / beta.
    assert rows[("25", "MB", "256")].split()[17:20] == ["45.13", "1.104", "89.2%"]
    assert rows[("25", "MB", "24")].split()[17] == "81.31"
    assert model.halving_time(25e6, 256, model.PAPER) == pytest.approx(16 * 306e-6 + 2 * 255 / 256 * 25e6 / 1.238e9)
    # libmccl's setting for these parameters: 306e-6 s x 1.238e9 B/s = 378828 B.
    assert "# for libmccl: MCCL_ALPHA_BETA=378828 (alpha x beta, bytes)" in out
    assert png.stat().st_size > 10_000


def test_fit_cli_on_our_bench_file(capsys):
    assert model.main(["fit", BENCH, "--backend", "mccl", "--op", "all_reduce", "--holdout"]) == 0
    out = capsys.readouterr().out
    assert "# ring: 6 points, alpha = " in out and "# doubling: 4 points" in out
    rows = [line for line in out.splitlines() if line.split()[:1] in (["ring"], ["doubling"])]
    assert len(rows) == 10 and all(line.endswith(f" {BENCH}") for line in rows)  # its file, as given
    # The setting printed is the fitted ring's alpha x beta, in whole bytes.
    ring = model.fit(model.points_from([BENCH], backend="mccl", op="all_reduce")[0], "ring")
    assert ring.alpha_identified
    assert f"MCCL_ALPHA_BETA={round(ring.params.alpha * ring.params.beta)}\n" in out


def test_a_fit_pooling_two_networks_warns(tmp_path, capsys):
    """One alpha and beta fitted to runs of two networks describe neither: the fit says so."""
    data = json.load(open(BENCH))
    slow = dict(data, meta=dict(data["meta"], goodput=dict(data["meta"]["goodput"], bits_per_s=5e8)))
    bare = dict(data, meta={k: v for k, v in data["meta"].items() if k != "goodput"})
    for other, says in ((slow, "measured on networks of different goodput"), (bare, "has no measured goodput")):
        (tmp_path / "other.json").write_text(json.dumps(other))
        assert model.main(["fit", BENCH, str(tmp_path / "other.json")]) == 0
        assert says in capsys.readouterr().err
    assert model.main(["fit", BENCH, BENCH]) == 0  # the same network twice: no warning
    assert "warning" not in capsys.readouterr().err


def test_predict_from_fit(capsys):
    assert model.main(["predict", "--fit", BENCH, "--hosts", "8", "--bucket-mb", "64", "--mib"]) == 0
    out = capsys.readouterr().out
    assert "fitted to" in out and "64 MiB" in out


def with_env(src, dst, env):
    """A copy of the bench file ``src`` at ``dst`` whose metadata holds ``env``."""
    data = json.load(open(src))
    data["meta"]["env"] = env
    dst.write_text(json.dumps(data))
    return str(dst)


def test_fit_models_the_segment_the_runs_used(tmp_path, capsys):
    # Unset: libmccl's default, 256 KiB; set: the run's; other backends: the paper's form (0).
    plain = with_env(BENCH, tmp_path / "plain.json", {})
    big = with_env(BENCH, tmp_path / "big.json", {"MCCL_SEGMENT_BYTES": "1048576"})
    assert model.run_segment([plain]) == 256 * 1024
    assert model.run_segment([big, big]) == 1 << 20
    assert model.run_segment([plain, big], backend="gloo") == 0
    with pytest.raises(model.ModelError, match=r"different ring segments.*/plain.json: 256 KiB.*/big.json: 1024 KiB"):
        model.run_segment([plain, big])
    # What libmccl does with a setting it refuses (csrc/core/param.c): warn and run the default.
    for raw in ("lots", "0", "1K", "4095", "2G", "1e5", "64KB", " 64K", "inf", "1e400", True):
        odd = with_env(BENCH, tmp_path / "odd.json", {"MCCL_SEGMENT_BYTES": raw})
        assert model.run_segment([odd]) == 256 * 1024, raw
    for raw, v in (("4096", 4096), ("64k", 64 << 10), ("0100000", 100000), ("1G", 1 << 30)):
        assert model.run_segment([with_env(BENCH, tmp_path / "ok.json", {"MCCL_SEGMENT_BYTES": raw})]) == v
    assert model.main(["fit", big]) == 0
    assert "segment 1024 KiB" in capsys.readouterr().out
    assert model.main(["fit", plain, "--segment-kb", "0"]) == 0
    assert "max(alpha, c/beta);" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        model.main(["fit", plain, big])
    assert exc.value.code == 2 and "give --segment-kb" in capsys.readouterr().err
    # The paper's parameters keep the paper's form unless told otherwise.
    assert model.main(["predict", "--hosts", "70", "--bucket-mb", "25"]) == 0
    assert "step = max(alpha, c/beta)" in capsys.readouterr().out


def test_segments_without_a_single_frame_point_leave_alpha_bounded():
    # 8 hosts, 4-256 MiB in 256 KiB frames: every chunk is 2 or more frames, so every step is
    # bandwidth-bound for any alpha under a frame's flight. One point 0.4% slow (noise) must not
    # be read as a hop cost of hundreds of us sitting at the kink max(c/beta, alpha + s/beta).
    beta, seg = 0.62e9, 256 * 1024
    pts = [Point(S, 8, 14 * S / 8 / beta * (1.004 if S == 4 << 20 else 1.0), "ring") for S in (4 << 20, 16 << 20, 64 << 20, 256 << 20)]
    f = model.fit(pts, "ring", segment=seg)
    assert not f.alpha_identified and f.params.alpha == 0
    assert f.alpha_bound == pytest.approx(seg / f.params.beta, rel=1e-6)  # 4 MiB: c - s(c) = one frame
    # A single-frame point (1 MiB: 128 KiB chunks) anchors alpha: it is fitted again.
    t1 = 14 * (20e-6 + (1 << 20) / 8 / beta)
    f = model.fit(pts + [Point(1 << 20, 8, t1, "ring")], "ring", segment=seg)
    assert f.alpha_identified and f.params.alpha == pytest.approx(20e-6, rel=0.05)


def test_held_out_sizes_on_our_six_round_run():
    """A regression guard on a committed GPU-machine run (8 hosts, 1-256 MiB, 6 rounds; bench/NOTES.md,
    2026-12-06 fifth session): each size predicted from the others within 2%. Before alpha was
    anchored to single-frame steps, 1 MiB held out came out 198% high."""
    path = os.path.join(REPO, "bench", "results", "device-trace-20261206-134144", "base8-SIZES_1M_4M_16M_64M_256M.json")
    pts, _ = model.points_from([path], min_size=1 << 20)
    f = model.fit(pts, "ring", segment=model.run_segment([path]), holdout="size")
    assert len(pts) == 5 and max(abs(f.holdout)) < 0.02


def test_predict_from_a_fit_prints_the_setting_fit_prints(capsys):
    assert model.main(["fit", BENCH]) == 0
    setting = [w for w in capsys.readouterr().out.split() if w.startswith("MCCL_ALPHA_BETA=")]
    assert setting == ["MCCL_ALPHA_BETA=34305"]
    assert model.main(["predict", "--hosts", "8", "--bucket-mb", "25", "--fit", BENCH]) == 0
    assert "# for libmccl: MCCL_ALPHA_BETA=34305 (" in capsys.readouterr().out


def test_one_algorithm_that_cannot_be_fitted_leaves_the_other(tmp_path, capsys):
    # Doubling times that do not grow with size: its beta is undetermined; the ring still fits.
    data = json.load(open(BENCH))
    for r in data["results"]:
        if r.get("backend") == "mccl" and r.get("op") == "all_reduce" and r["size"] < 256 * 1024:
            r["time_us"] = 300.0 - r["size"] / 1024
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(data))
    assert model.main(["fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# not fitted: doubling: the points do not determine beta" in out and "# ring: 6 points" in out
    assert model.main(["predict", "--hosts", "12", "--bucket-mb", "1", "--fit", str(path)]) == 0


@pytest.mark.parametrize("field, value, message", [
    ("time_us", "abc", r"results\[\d+\]: not a timed row"),
    ("time_us", None, r"results\[\d+\]: not a timed row"),
    ("time_us", 0, r"results\[\d+\]: time_us must be a finite number > 0"),
    ("size", "big", r"results\[\d+\]: not a timed row"),
    ("nranks", "eight", r"results\[\d+\]: not a timed row"),
    ("size", None, r"results\[\d+\]: not a timed row"),
])
def test_a_malformed_row_is_named(tmp_path, capsys, field, value, message):
    data = json.load(open(BENCH))
    row = next(r for r in data["results"] if r.get("backend") == "mccl" and r.get("op") == "all_reduce")
    row[field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as exc:
        model.main(["fit", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and str(path) in err
    assert re.search(message, err), err


def test_cli_edges(tmp_path, capsys):
    for argv, message in ((["predict", "--hosts", "1,8"], "host counts >= 2"),
                          (["predict", "--uplink-gbs", "0"], "--uplink-gbs"),
                          (["predict", "--plot", str(tmp_path / "x.txt")], "give a .png, .pdf or .svg"),
                          (["predict", "--plot", "/proc/no/x.png"], "cannot write a file in /proc/no")):
        with pytest.raises(SystemExit) as exc:
            model.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err, argv
    assert model.main(["predict", "--hosts", "8", "--bucket-mb", "25", "--plot", str(tmp_path / "new" / "x.png")]) == 0
    assert (tmp_path / "new" / "x.png").stat().st_size > 0  # a missing folder is made, as mccl.bench does
    capsys.readouterr()
    assert model.main(["predict", "--hosts", "8", "--bucket-mb", "25", "--segment-kb", "inf"]) == 0
    assert "additive steps are never purely bandwidth-bound" in capsys.readouterr().out
    # A reader that stops early (`| head -1`) is not an error.
    r = subprocess.run(f"{sys.executable} -m mccl.model fit {BENCH} --holdout | head -1", shell=True,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")))
    assert r.stdout.startswith("# mccl.model fit") and "Traceback" not in r.stderr, r.stderr


HELD_OUT = [os.path.join(REPO, "bench", "results", d, f) for d, f in [
    ("device-trace-20261206-095856", "base8-SIZES_1K_16K_256K_1M_4M_16M_64M_256M.json"),
    ("device-trace-20261206-101427", "base12-SIZES_1M_4M_16M_64M.json"),
    ("device-trace-20261206-101626", "base4-SIZES_1M_4M_16M_64M.json")]]


def test_held_out_host_counts_on_our_runs():
    """A regression guard on three committed GPU-machine runs (4, 8 and 12 hosts, docs/SCALING.md):
    each host count predicted from a fit to the other two. With the segment MCCL ran (256 KiB), a
    12-host 1 MiB step (87 KB chunk, one frame) costs alpha + c/beta; the paper's max form prices it
    at the alpha that the bandwidth-bound points only bound from above, 44% too high."""
    pts, _ = model.points_from(HELD_OUT, min_size=1 << 20)
    seg = model.fit(pts, "ring", segment=model.run_segment(HELD_OUT), holdout="hosts")
    paper = model.fit(pts, "ring", segment=0.0, holdout="hosts")
    err = {(q.nranks, q.size): e for q, e in zip(seg.points, seg.holdout)}
    assert len(err) == 13
    assert max(abs(e) for (n, S), e in err.items() if S >= 4 << 20) < 0.02
    assert abs(err[(12, 1 << 20)]) < 0.04
    i = [k for k, q in enumerate(paper.points) if (q.nranks, q.size) == (12, 1 << 20)][0]
    assert paper.holdout[i] > 0.40


ONE_MACHINE = os.path.join(REPO, "bench", "results", "device-trace-20261206-173830")
ONE_MACHINE_DEFAULT = {n: os.path.join(ONE_MACHINE, f) for n, f in [
    (4, "base4-SIZES_1M_4M_16M_64M.json"),
    (8, "base8-OPS_all_reduce_all_gather_broadcast_SIZES_1M_4M_16M_64M.json"),
    (12, "base12-SIZES_1M_4M_16M_64M.json")]}


def test_host_counts_from_the_8_host_run_on_one_machine():
    """The issue's acceptance, as a regression guard on committed runs: 4, 8 and 12 hosts measured on
    one GPU machine in one device call (bench/NOTES.md, 2026-12-06 sixth session), MCCL's default
    configuration at each count. Fitted to the 8-host run alone, the model predicts the 4- and
    12-host times within 3% (measured: 0.42% at most); each host count held out from a fit to the
    other two, and each size held out of the 8-host run, within 3% too (0.51% and 0.54%)."""
    p8, _ = model.points_from([ONE_MACHINE_DEFAULT[8]], min_size=1 << 20)
    seg = model.run_segment([ONE_MACHINE_DEFAULT[8]])
    f8 = model.fit(p8, "ring", segment=seg, holdout="size")
    assert len(f8.points) == 4 and max(abs(e) for e in f8.holdout) < 0.03
    for n in (4, 12):
        q, _ = model.points_from([ONE_MACHINE_DEFAULT[n]], min_size=1 << 20)
        assert len(q) == 4 and all(p.nranks == n for p in q)
        err = model.predict_points(q, f8.params, "ring") / np.array([p.time_s for p in q]) - 1
        assert np.all(np.abs(err) < 0.03), (n, err)
    files = list(ONE_MACHINE_DEFAULT.values())
    pts, _ = model.points_from(files, min_size=1 << 20)
    held = model.fit(pts, "ring", segment=model.run_segment(files), holdout="hosts")
    assert len(held.points) == 12 and max(abs(e) for e in held.holdout) < 0.03
    # The paper's max form on the same runs: 12 hosts at 1 MiB held out is far off (+49% measured).
    paper = model.fit(pts, "ring", segment=0.0, holdout="hosts")
    i = [k for k, q in enumerate(paper.points) if (q.nranks, q.size) == (12, 1 << 20)][0]
    assert paper.holdout[i] > 0.30


@pytest.mark.parametrize("argv, message", [
    (["predict", "--hosts", "0,8"], "--hosts"),
    (["predict", "--hosts", "eight"], "--hosts"),
    (["predict", "--bucket-mb", "-25"], "--bucket-mb"),
    (["predict", "--alpha-us", "306", "--fit", "x.json"], "not allowed with"),
    (["predict", "--groups", "0"], "--groups must be >= 1"),
    (["predict", "--groups", "4", "--group-size", "16"], "not allowed with"),
    (["fit", "/nonexistent/bench.json"], "cannot read"),
    (["fit", BENCH, "--op", "broadcast"], "invalid choice"),
    (["fit", BENCH, "--backend", "nccl"], "no timed all_reduce rows of backend 'nccl'"),
    (["fit"], "FILE.json"),
    ([], "required"),
    (["predict", "--hosts", "1000000000"], "this model prices at most 100000"),
    (["predict", "--plot", "/proc/x.png"], "cannot write a file in /proc"),
    (["fit", BENCH, "--threshold", "-5"], "a size is 0 or more bytes"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        model.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_not_a_bench_file(tmp_path, capsys):
    bad = tmp_path / "summary.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as exc:
        model.main(["fit", str(bad)])
    assert exc.value.code == 2 and "not a mccl.bench collectives file" in capsys.readouterr().err


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "mccl.model", "predict", "--hosts", "70", "--bucket-mb", "25"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "two-level" in r.stdout and "70" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mccl.model", "predict", "--hosts", "-3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--hosts" in r.stderr
