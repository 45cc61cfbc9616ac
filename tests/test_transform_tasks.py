"""Planning a transform job shared among processes: its files cut into tasks, and the tasks' results joined into
the job's outputs and summary."""

from __future__ import annotations

from pathlib import Path

from inference_server._settings import BatchStrategy
from inference_server.transform import TransformOptions, TransformSummary, storage
from inference_server.transform.job import Task
from inference_server.transform.tasks import STOPPED, finish, plan, prepare


def test_plan_cuts_large_files_into_parts_and_resume_skips_finished_ones(tmp_path: Path) -> None:
    """A file over the part size is a task per part (ceil(size / part size)); a smaller one, or any file of
    SplitType None, is one task; with resume a file whose .out is newer has none."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_bytes(b"x\n" * (5 << 18))  # 2.5 MiB
    (tmp_path / "in" / "b.csv").write_bytes(b"y\n")
    source, output = storage.store(str(tmp_path / "in")), storage.store(str(tmp_path / "out"))
    files = source.inputs()
    options = TransformOptions(split_type="Line", part_size_mb=1)
    assert [(t.name, t.part, t.parts) for t in plan(source, output, files, options)] == [
        ("a.csv", 0, 3),
        ("a.csv", 1, 3),
        ("a.csv", 2, 3),
        ("b.csv", 0, 1),
    ]
    whole = TransformOptions(split_type="None", part_size_mb=1)
    assert [(t.name, t.parts) for t in plan(source, output, files, whole)] == [("a.csv", 1), ("b.csv", 1)]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "b.csv.out").write_bytes(b"done")
    resumed = TransformOptions(split_type="Line", part_size_mb=1, resume=True)
    assert {t.name for t in plan(source, output, files, resumed)} == {"a.csv"}


def test_finish_joins_parts_in_order_and_removes_those_of_failed_files(tmp_path: Path) -> None:
    """finish: a file whose parts all succeeded becomes one .out, its parts joined in order; a file with a failed
    part, or a part that never ran, is failed with the part's reason (or as stopped) and leaves nothing;
    counts add up over all parts."""
    out = tmp_path / "out"
    out.mkdir()
    store = storage.store(str(out))
    tasks = [Task(f"/in/{n}", n, p, k) for n, k in (("x", 3), ("y", 2), ("z", 2)) for p in range(k)]
    results = {}
    for task in tasks:
        (out / Path(task.target(store)).name).write_bytes(b"%s%d;" % (task.name.encode(), task.part))
        if task.name != "z" or task.part == 0:
            failed = [("y", "y: record 3 failed")] if (task.name, task.part) == ("y", 1) else []
            results[task] = TransformSummary(records=10, requests=2, failed=failed)
    files = [(f"/in/{n}", n) for n in "xyzw"]  # w: finished before (resume), no task
    summary = finish(str(out), files, tasks, results)
    assert sorted(path.name for path in out.iterdir()) == ["x.out"]
    assert (out / "x.out").read_bytes() == b"x0;x1;x2;"
    assert summary.failed == [("y", "y: record 3 failed"), ("z", STOPPED)]
    assert (summary.files, summary.skipped, summary.records, summary.requests) == (4, 1, 60, 12)


def test_prepare_lists_the_inputs_completes_the_options_and_plans_the_tasks(tmp_path: Path) -> None:
    """prepare: every file under the root, the options left unset taken from the hooks' execution parameters, and
    plan's tasks for them."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.csv").write_bytes(b"1\n2\n")
    (tmp_path / "in" / "sub" / "b.csv").write_bytes(b"3\n")
    options = TransformOptions(split_type="Line", max_concurrent_transforms=2, model_dir=str(tmp_path / "model"))
    files, resolved, tasks = prepare(str(tmp_path / "in"), str(tmp_path / "out"), options)
    assert [name for _, name in files] == ["a.csv", "sub/b.csv"]
    limits = (resolved.batch_strategy, resolved.max_payload_in_mb, resolved.max_concurrent_transforms)
    assert limits == (BatchStrategy.MULTI_RECORD, 6, 2)
    assert [(task.name, task.parts) for task in tasks] == [("a.csv", 1), ("sub/b.csv", 1)]
