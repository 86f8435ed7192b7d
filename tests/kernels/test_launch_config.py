"""The shipped per-device launch tables (ops/configs/*.json): each is found under its device's
name and every row is one the kernels can launch, so a mistyped or half-merged table fails
here, not on the user's GPU."""

import json
import logging.handlers
import sys
from pathlib import Path

import pytest
import torch

from vllm_nemotron_h.ops import launch_config
from vllm_nemotron_h.ops.causal_conv1d_update import interface as conv_update

TABLE_FILES = sorted(launch_config.CONFIGS_DIR.glob("*.json"))
# Kernels whose tables are keyed by "head_dim,d_state,state bytes"; the conv update's table
# is one list of rows.
STATE_KERNELS = ("selective_state_update", "deferred_state_update", "mamba2_decode")
WARPS = (1, 2, 4, 8)
# Whether deferred writes pay, per state format: [max batch x heads, 1 or 0] rows.
DEFERRING_PAYS = "deferred_state_update_pays"


def is_power_of_two(n: object) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def check_limits(where: str, rows: list) -> None:
    """Row limits increasing, the last open (null)."""
    assert rows, f"{where}: no rows"
    limits = [row[0] for row in rows]
    assert limits[-1] is None, f"{where}: the last row must be open-ended (null), got {limits}"
    assert None not in limits[:-1], f"{where}: only the last row may be open-ended: {limits}"
    assert limits[:-1] == sorted(set(limits[:-1])), f"{where}: limits not increasing: {limits}"


def check_rows(where: str, rows: list, tiles_per_program: bool = False) -> None:
    """[limit, tile, num_warps] rows (the state update's may add tiles per program, >= 1):
    limits as check_limits says, tiles powers of two, warps a count Triton launches."""
    check_limits(where, rows)
    for row in rows:
        if tiles_per_program and len(row) == 4:
            assert isinstance(row[3], int) and row[3] >= 1, f"{where}: row {row}: tiles < 1"
            row = row[:3]
        assert len(row) == 3, f"{where}: row {row} is not [limit, tile, num_warps]"
        _, tile, warps = row
        assert is_power_of_two(tile), f"{where}: tile {tile} is not a power of two"
        assert warps in WARPS, f"{where}: num_warps {warps} not in {WARPS}"


def test_tables_are_shipped():
    assert TABLE_FILES, f"no launch tables in {launch_config.CONFIGS_DIR}"


@pytest.mark.parametrize("path", TABLE_FILES, ids=lambda p: p.stem)
def test_table_file_is_well_formed(path):
    data = json.loads(path.read_text())
    assert launch_config.device_file(data["device"]) == path, "file name != its device's"
    assert isinstance(data["how"], str) and data["how"], "say how the table was made"
    known = {"device", "how", "causal_conv1d_update", "mamba2_decode_fused_max_batch_heads"}
    known.update(STATE_KERNELS, [DEFERRING_PAYS])
    assert set(data) <= known, f"unknown entries {sorted(set(data) - known)}"
    for kernel in (*STATE_KERNELS, DEFERRING_PAYS):
        for key, rows in data.get(kernel, {}).items():
            head_dim, d_state, state_bytes = (int(v) for v in key.split(","))
            assert head_dim > 0 and d_state > 0, f"{kernel} {key}"
            assert state_bytes in (1, 2, 4), f"{kernel} {key}: state bytes {state_bytes}"
            where = f"{path.name} {kernel} {key}"
            if kernel == DEFERRING_PAYS:
                check_limits(where, rows)
                assert all(len(r) == 2 and r[1] in (0, 1) for r in rows), f"{where}: {rows}"
            else:
                check_rows(where, rows, kernel == "selective_state_update")
    if "causal_conv1d_update" in data:
        check_rows(f"{path.name} causal_conv1d_update", data["causal_conv1d_update"])
    fused_max = data.get("mamba2_decode_fused_max_batch_heads")
    assert fused_max is None or (isinstance(fused_max, int) and fused_max >= 0)


def test_state_update_rows_carry_tiles_per_program():
    """A state-update row's fourth value is the tiles a program advances; a program's rows
    (tile x tiles) are cut back to divide the rows of a group, and a row without it is one
    tile a program."""
    config = launch_config.plane_tile_config
    rows = {"64,128,1": [[128, 32, 8], [None, 32, 1, 2]]}
    cpu = torch.device("cpu")
    with launch_config.overridden("selective_state_update", rows):
        assert config("selective_state_update", cpu, 64, 128, torch.int8, 128, 1024) == (32, 8, 1)
        assert config("selective_state_update", cpu, 64, 128, torch.int8, 4096, 1024) == (32, 1, 2)
        assert config("selective_state_update", cpu, 64, 128, torch.int8, 4096, 32) == (32, 1, 1)
        assert config("selective_state_update", cpu, 64, 128, torch.int8, 4096, 48) == (16, 1, 1)


def test_device_file_writes_a_row_per_line(tmp_path, monkeypatch):
    """tune.py --tables --write: rows of three or four values, one a line, read back equal."""
    monkeypatch.setattr(launch_config, "CONFIGS_DIR", tmp_path)
    tables = {"selective_state_update": {"64,128,1": [[128, 32, 8], [None, 16, 1, 4]]}}
    path = launch_config.write_device_file("Some GPU", tables, "a test")
    lines = path.read_text().splitlines()
    assert "   [128, 32, 8]," in lines and "   [null, 16, 1, 4]" in lines
    data = json.loads(path.read_text())
    assert data["selective_state_update"] == tables["selective_state_update"]


def test_sweeps_become_rows_with_tiles_only_where_several():
    """tune.py's tables from a sweep: the fastest config per point, tiles per program kept
    only where a program advances several."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    from sweep_tables import tuned_tables

    def row(batch, config, us):
        return dict(kernel="selective_state_update", model="nemotron-h-8b", state_dtype="int8",
                    batch=batch, config=config, us=us)  # fmt: skip

    sweep = [row(1, [32, 8, 1], 4.0), row(1, [16, 1, 4], 5.0),
             row(128, [32, 8, 1], 150.0), row(128, [16, 1, 4], 120.0)]  # fmt: skip
    rows = tuned_tables(sweep)["selective_state_update"]["64,128,1"]
    assert rows == [[128, 32, 8], [None, 16, 1, 4]]


def test_writing_a_sweep_keeps_the_keys_it_did_not_measure(tmp_path, monkeypatch):
    """tune.py --tables SWEEP --write DEVICE: the swept keys replace theirs, the rest stays,
    and the file's "how" says both."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    from sweep_tables import write_tables

    monkeypatch.setattr(launch_config, "CONFIGS_DIR", tmp_path)
    launch_config.write_device_file(
        "Some GPU",
        {
            "selective_state_update": {"64,128,1": [[None, 16, 1]], "80,128,1": [[None, 32, 1]]},
            "causal_conv1d_update": [[None, 256, 2]],
        },
        "first sweep",
    )
    new = {"selective_state_update": {"64,128,1": [[128, 32, 8], [None, 16, 1, 4]]}}
    data = json.loads(write_tables("Some GPU", new, "from the second").read_text())
    assert data["selective_state_update"] == {
        "64,128,1": [[128, 32, 8], [None, 16, 1, 4]],
        "80,128,1": [[None, 32, 1]],
    }
    assert data["causal_conv1d_update"] == [[None, 256, 2]]
    assert data["how"] == "first sweep; then selective_state_update 64,128,1 from the second"


def test_a_rank_sweep_goes_in_front_of_the_rows_of_larger_points(tmp_path, monkeypatch):
    """tune.py --tables SWEEP --write DEVICE --in-front: one TP rank's sweep (8B at TP=4, B=1
    and 2: 32 and 64 heads) adds rows for its points before the file's, which stay."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    from sweep_tables import tuned_tables, write_tables

    def row(batch, config, us):
        return dict(kernel="mamba2_decode", model="nemotron-h-8b", state_dtype="float32",
                    batch=batch, config=config, us=us, tensor_parallel_size=4)  # fmt: skip

    monkeypatch.setattr(launch_config, "CONFIGS_DIR", tmp_path)
    launch_config.write_device_file(
        "Some GPU", {"mamba2_decode": {"64,128,4": [[128, 32, 4], [None, 128, 4]]}}, "TP=1"
    )
    sweep = [row(1, [8, 4], 2.0), row(1, [32, 4], 3.0),
             row(2, [8, 4], 4.0), row(2, [32, 4], 3.5)]  # fmt: skip
    tables = tuned_tables(sweep, open_ended=False)
    assert tables["mamba2_decode"]["64,128,4"] == [[32, 8, 4], [64, 32, 4]]
    data = json.loads(write_tables("Some GPU", tables, "TP=4", in_front=True).read_text())
    assert data["mamba2_decode"]["64,128,4"] == [[32, 8, 4], [128, 32, 4], [None, 128, 4]]
    # a key the file has no rows for: past the sweep's points the kernel's untuned config
    sweep = [{**r, "state_dtype": "int8"} for r in sweep]
    data = json.loads(
        write_tables("Some GPU", tuned_tables(sweep, False), "TP=4", in_front=True).read_text()
    )
    assert launch_config.untuned_plane_tile(128, 1) == (64, 4)
    assert data["mamba2_decode"]["64,128,1"] == [[32, 8, 4], [64, 32, 4], [None, 64, 4]]
    # the conv update's rows (one list: a TP=4 rank of the 8B has 2,560 channels) go in front
    # of the file's rows, or of the op's default where the file has none
    conv = [{**r, "kernel": "causal_conv1d_update", "config": [r["config"][0], 2]} for r in sweep]
    conv_rows = tuned_tables(conv, open_ended=False)["causal_conv1d_update"]
    assert conv_rows == [[2560, 8, 2], [5120, 32, 2]]

    def written_conv_rows() -> list:
        tables = {"causal_conv1d_update": conv_rows}
        return json.loads(write_tables("Some GPU", tables, "TP=4", in_front=True).read_text())[
            "causal_conv1d_update"
        ]

    assert written_conv_rows() == [*conv_rows, [None, *conv_update.DEFAULT_CONFIG]]
    launch_config.write_device_file(
        "Some GPU", {"causal_conv1d_update": [[4096, 64, 4], [8192, 64, 8], [None, 256, 2]]}, "TP=1"
    )
    assert written_conv_rows() == [*conv_rows, [8192, 64, 8], [None, 256, 2]]


def test_deferred_writes_run_the_per_step_launch_where_the_table_says_deferring_does_not_pay():
    """A layer with deferred writes defers only where its tail is not fused and the device
    table's rows for its state format say deferring pays (no rows: it pays); at the other
    batch sizes its plan runs the per-step launch and says so to the builder, which then keeps
    the rings empty. Beyond the table (a padded CUDA-graph batch) the layer defers."""
    from dataclasses import replace

    from vllm_nemotron_h.model_executor.decode_plan import DecodePlan
    from vllm_nemotron_h.ops.deferred_state_update import interface as deferred_op
    from vllm_nemotron_h.ops.mamba2_decode.interface import DecodeShape, resolve_launch
    from vllm_nemotron_h.ops.mamba2_decode.kernel import DecodeWorkspace
    from vllm_nemotron_h.vllm_boundary.engine_log import plugin_logger

    cpu = torch.device("cpu")
    shape = DecodeShape(8, 80, 16, 4, 4, torch.float32, cpu, ring_size=4)
    pays = {"80,16,4": [[16, 0], [None, 1]]}  # up to 2 sequences of 8 heads: per step
    with launch_config.overridden("mamba2_decode_fused_max_batch_heads", 0):
        assert all(resolve_launch(shape, b).defers for b in (1, 2, 3, 64))
        with launch_config.overridden(DEFERRING_PAYS, pays):
            assert not deferred_op.pays(cpu, 80, 16, torch.float32, 16)
            assert deferred_op.pays(cpu, 80, 16, torch.float32, 24)
            assert deferred_op.pays(cpu, 80, 16, torch.int8, 16)  # no rows for int8
            assert [resolve_launch(shape, b).defers for b in range(5)] == [
                False, False, False, True, True,
            ]  # fmt: skip
            plan = DecodePlan(4, 8, 80, cpu)
            # as a CUDA plan has (batch 0 fuses)
            plan.workspace = DecodeWorkspace.allocate(4, 8, 80, cpu)
            said, logger = logging.handlers.BufferingHandler(8), plugin_logger()
            level = logger.level
            logger.addHandler(said)
            logger.setLevel(logging.INFO)  # as in a vLLM process
            try:
                launches = plan.deferring_launches(shape)
            finally:
                logger.removeHandler(said)
                logger.setLevel(level)
            assert any("deferred update at batch sizes 3-4 of 1-4" in r.getMessage()
                       for r in said.buffer), [r.getMessage() for r in said.buffer]  # fmt: skip
            per_step = plan.launches(replace(shape, ring_size=0))
            assert launches[1] is per_step[1] and launches[2] is per_step[2]
            assert launches[3].defers and launches[4].defers
            assert [plan.writes_every_token(b) for b in range(6)] == [
                True, True, True, False, False, False,
            ]  # fmt: skip
    with launch_config.overridden("mamba2_decode_fused_max_batch_heads", 16):
        # a fused batch writes every token whatever the table says of deferring
        assert [resolve_launch(shape, b).defers for b in (1, 2, 3)] == [False, False, True]
