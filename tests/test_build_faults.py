"""`edgex build` under faults: SIGKILL mid-export, two builds on one output folder, a full disk,
a read-only output, and a checkpoint rewritten during the build."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import EDGEX, ONE_JOB_BUILD, run_cli
from edgex.errors import EdgexError

pytestmark = pytest.mark.xdist_group("build-faults")

ONE_JOB = ONE_JOB_BUILD
TWO_JOBS = ONE_JOB.replace('["fp32"]', '["fp32", "fp16"]')


def visible_files(out: Path) -> list[str]:
    """Files a reader of the output tree would take for results (hidden cache, lock and staging aside)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(out).parts))


def committed_entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")) if cache.is_dir() else []


def wait_for(condition, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the build ended early (rc {proc.returncode}): {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "timed out waiting for the build"
        time.sleep(0.2)


@contextmanager
def tmpfs(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A two-artifact build killed with SIGKILL while it exports the second artifact, after the first
    was cached; just before, a second build was started on the same output folder."""
    root = tmp_path_factory.mktemp("killed")
    file = root / "two.toml"
    file.write_text(TWO_JOBS)
    out, cache = root / "out", root / "out" / ".edgex-cache"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([*EDGEX, "build", str(file), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        wait_for(lambda: len(committed_entries(cache)) == 1 and any(cache.glob(".tmp-*/*/*/.staging-*")), 900, proc)
        # Frozen mid-export (it keeps its lock), so the second build meets it however long that one
        # takes to start; then killed where it stands.
        os.killpg(proc.pid, signal.SIGSTOP)
        second = run_cli("build", str(file), "--out", str(out))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    state = {"visible": visible_files(out), "tmp": sorted(p.name for p in cache.glob(".tmp-*")),
             "entries": committed_entries(cache), "rc": proc.returncode, "second": second, "pid": proc.pid}
    rerun = run_cli("build", str(file), "--out", str(out), "--json")
    return out, state, rerun


def test_concurrent_build_on_the_same_output_is_refused(killed):
    _, state, _ = killed
    second = state["second"]
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgex: output folder ")
    assert f"is in use by another edgex build (pid {state['pid']}," in lines[0] and "Traceback" not in second.stderr


def test_sigkill_mid_export_leaves_no_valid_looking_file(killed):
    out, state, _ = killed
    from edgex.build.cache import files_root, intact

    assert state["rc"] == -signal.SIGKILL
    assert state["visible"] == []  # no manifest, no artifact, no report in the tree
    assert state["tmp"]  # the interrupted export is a hidden temporary folder, not an entry
    (entry,) = state["entries"]  # the one finished artifact is a complete, intact entry
    manifest = json.loads((files_root(entry) / "manifest.json").read_text())
    assert intact(manifest, files_root(entry)) and manifest["artifacts"][0]["precision"] == "fp32"


def test_rerun_after_sigkill_resumes_from_the_cache(killed):
    out, _, rerun = killed
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    data = json.loads(rerun.stdout)
    assert {a["precision"]: a["build"]["reused"] for a in data["artifacts"]} == {"fp32": True, "fp16": False}
    assert not list(out.rglob(".tmp-*")) and not list(out.rglob(".staging-*"))  # the killed build's leftovers swept
    assert sorted(visible_files(out)) == sorted(
        ["build.json", "junit.xml", "summary.json", "summary.md", "qwen3-tts/cpu/manifest.json"]
        + [f"qwen3-tts/cpu/{r['path']}" for a in data["artifacts"] for r in a["files"]])


def one_line_error(proc) -> str:
    """Exit 2 and one `edgex:` line (after the progress log), no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("edgex: ")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.rstrip().endswith(lines[0])
    return lines[0]


def test_full_disk_during_export_is_one_line_and_leaves_nothing(tmp_path):
    file = tmp_path / "one.toml"
    file.write_text(ONE_JOB)
    with tmpfs(tmp_path / "full", "size=256k") as out:  # the 690 kB ONNX pair cannot fit
        line = one_line_error(run_cli("build", str(file), "--out", str(out)))
        # numpy reports the short write without errno: "OSError: problem writing element N to file"
        assert "writing the export failed (OSError: " in line and "removed its temporary files" in line
        assert visible_files(out) == [] and sorted(p.name for p in out.iterdir()) == [".edgex-build.lock", ".edgex-cache"]
        assert list((out / ".edgex-cache").iterdir()) == []


def test_full_disk_while_publishing_is_one_line_and_leaves_nothing(tmp_path, killed):
    """The artifacts are in a cache elsewhere (reused); copying them into the full output fails."""
    source, _, rerun = killed
    assert rerun.returncode == 0
    file = tmp_path / "one.toml"
    file.write_text(ONE_JOB)
    cache = tmp_path / "cache"
    shutil.copytree(source / ".edgex-cache", cache)
    with tmpfs(tmp_path / "full", "size=64k") as out:
        line = one_line_error(run_cli("build", str(file), "--out", str(out), "--cache", str(cache)))
        assert line.startswith(f"edgex: cannot write the build to {out}: No space left on device")
        assert [p.name for p in out.iterdir()] == [".edgex-build.lock"]


def test_read_only_output_is_one_line_and_writes_nothing(tmp_path):
    file = tmp_path / "one.toml"
    file.write_text(ONE_JOB)
    with tmpfs(tmp_path / "ro", "ro,size=1m") as out:
        line = one_line_error(run_cli("build", str(file), "--out", str(out / "build")))
        assert "Read-only file system" in line and "is not writable" in line
        assert list(out.iterdir()) == []


def test_checkpoint_rewritten_during_the_build_is_detected(tmp_path):
    from safetensors.torch import save_file

    from edgex.build.run import run_build
    from edgex.recipes.qwen3_tts.models import build_from_preset
    from edgex.recipes.qwen3_tts.presets import get_preset

    preset = get_preset("tiny")
    models = build_from_preset(preset, seed=3)
    ckpt = tmp_path / "ckpt"
    (ckpt / "speech_tokenizer").mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({"talker_config": preset.talker, "tts_model_type": "base"}))
    (ckpt / "speech_tokenizer" / "config.json").write_text(json.dumps({"decoder_config": preset.decoder}))
    save_file({f"talker.{k}": v.contiguous() for k, v in models.talker.state_dict().items()}, str(ckpt / "model.safetensors"))
    save_file({f"decoder.{k}": v.contiguous() for k, v in models.decoder.state_dict().items()},
              str(ckpt / "speech_tokenizer" / "model.safetensors"))
    file = tmp_path / "ckpt.toml"
    file.write_text(ONE_JOB.replace('model = "qwen3-tts"', 'model = "qwen3-tts"\ncheckpoint = "ckpt"'))

    rewritten = []

    def rewrite_once(message: str) -> None:  # another process finishing a download, say
        if message.endswith("from the eager pipeline") and not rewritten:
            rewritten.append(message)
            with open(ckpt / "model.safetensors", "r+b") as f:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([last[0] ^ 1]))

    out = tmp_path / "out"
    with pytest.raises(EdgexError, match=r"checkpoint .*ckpt changed during the build .* 1 new artifact\(s\) were discarded"):
        run_build(file, out, progress=rewrite_once)
    assert visible_files(out) == [] and list((out / ".edgex-cache").iterdir()) == []
