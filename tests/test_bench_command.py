"""`ghostedit bench` as scripts/gpu/bench.sh runs it, on the tiny model: what each level writes, and the process
timeline that says where a bench process's wall time went."""
import json

from ghostedit.cli import build_parser


def bench(tmp_path, *arguments) -> dict:
    args = build_parser().parse_args(["bench", "--model", "tiny", "--device", "cpu", "--out-dir", str(tmp_path),
                                      *arguments])
    assert args.run(args) == 0
    assert (tmp_path / "table.md").exists() and (tmp_path / "chart.png").exists()
    return json.loads((tmp_path / "results.json").read_text())


def marks(results: dict) -> list[str]:
    times = [mark["s"] for mark in results["process_timeline"]]
    assert times == sorted(times) and times[0] > 0, times  # seconds since the process started, in order
    return [mark["after"] for mark in results["process_timeline"]]


def test_the_dit_level_writes_each_shape_and_where_its_process_time_went(tmp_path, capsys):
    results = bench(tmp_path, "--level", "dit", "--shapes", "64", "64:2", "--repeats", "1",
                    "--configs", "baseline", "fp8=storage")
    assert [(row["config"], row["shape"]) for row in results["rows"]] == [
        ("stock", "64x64"), ("stock", "64x64, 2 images"), ("fp8-storage", "64x64"),
        ("fp8-storage", "64x64, 2 images")]
    assert marks(results) == ["python and the CLI", "engine imported", "configurations checked", "weights built",
                              "stock at 64x64", "stock at 64x64, 2 images", "fp8-storage at 64x64",
                              "fp8-storage at 64x64, 2 images"]
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith("process timeline (s since start): python and the CLI ")
    assert printed.split(", ")[-1].startswith("results written ")


def test_the_pipeline_level_marks_each_configuration(tmp_path):
    results = bench(tmp_path, "--level", "pipeline", "--steps", "2", "--width", "64", "--height", "64",
                    "--repeats", "0", "--configs", "baseline", "fp8=storage")
    assert [row["config"] for row in results["rows"]] == ["stock", "fp8-storage"]
    assert marks(results)[3:] == ["weights built", "stock", "fp8-storage"]


def test_cold_rows_come_after_a_short_edit_that_sets_up_the_libraries(monkeypatch, tmp_path):
    from ghostedit.engine import Engine
    steps = []
    run = Engine.run

    def counted_run(self, request, config, *args, **kwargs):
        steps.append((request.steps, config.label))
        return run(self, request, config, *args, **kwargs)
    monkeypatch.setattr(Engine, "run", counted_run)
    results = bench(tmp_path, "--level", "pipeline", "--steps", "3", "--width", "64", "--height", "64",
                    "--repeats", "0", "--configs", "baseline", "fp8=storage")
    assert steps == [(2, "stock"), (3, "stock"), (3, "fp8-storage")]
    assert results["set_up_edit_steps"] == 2  # docs/benchmarks.md says so above the table
    steps.clear()
    bench(tmp_path, "--level", "pipeline", "--steps", "3", "--width", "64", "--height", "64", "--repeats", "1",
          "--configs", "baseline")
    assert steps == [(3, "stock"), (3, "stock")]  # warm rows: the cold run already set the libraries up
