"""Bad input: one line on stderr, a non-zero exit, no traceback, no half-written files."""

from pathlib import Path

import pytest

from conftest import run_cli


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("edgex: ")
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["export", "qwen4-tts"], ["no such model 'qwen4-tts'", "qwen3-tts"]),
        (["export", "qwen3-tts", "--target", "S25"], ["no such target 'S25'", "cpu"]),
        (["export", "qwen3-tts", "--precision", "int3"], ["no such precision 'int3'", "fp16"]),
        (["export", "qwen3-tts", "--component", "vocoder"], ["no such component 'vocoder'", "talker_decode"]),
        (["export", "qwen3-tts", "--preset", "huge"], ["no such preset 'huge'", "tiny"]),
        (["export", "qwen3-tts", "--format", "tflite"], ["no such format 'tflite'", "onnx"]),
        (["export", "qwen3-tts", "--format", "onnx", "--precision", "w8"], ["w8", "not supported"]),
        (["export", "qwen3-tts", "--min-db", "decoder=loud"], ["bad --min-db"]),
        (["export", "qwen3-tts", "--min-db", "decodr:fp16=40"], ["'decodr:fp16' is no role", "decoder"]),
        (["export", "qwen3-tts", "--executor", "slurm"], ["unknown --executor 'slurm'", "local, ray"]),
        (["export", "qwen3-tts", "--address", "10.0.0.5:6379"], ["--address names a Ray cluster", "--executor ray"]),
        (["export", "qwen3-tts", "--executor", "ray", "--hub"], ["--hub", "--executor local"]),
        (["build", str(Path(__file__).parents[1] / "builds" / "example.toml"), "--executor", "ray", "--jobs", "2"],
         ["--jobs and --max-memory", "local executor"]),
    ],
)
def test_unknown_names(tmp_path, args, fragments):
    proc = run_cli(*args, "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, *fragments)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.*"))


def test_unwritable_out_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_cli("export", "qwen3-tts", "--out", str(blocker / "sub"))
    assert_one_line_error(proc, "not writable")
    assert blocker.read_text() == "not a directory"


def test_missing_checkpoint(tmp_path):
    proc = run_cli("export", "qwen3-tts", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "does not exist")


def test_checkpoint_without_config(tmp_path):
    (tmp_path / "ckpt").mkdir()
    proc = run_cli("export", "qwen3-tts", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "config.json")
    assert not any(Path(tmp_path / "o").rglob("*.pte"))


def test_corrupt_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "speech_tokenizer").mkdir(parents=True)
    (ckpt / "config.json").write_text('{"talker_config": {}}')
    (ckpt / "speech_tokenizer" / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    proc = run_cli("export", "qwen3-tts", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "model.safetensors")
    assert not any(Path(tmp_path / "o").rglob("*.pte")) and not any(Path(tmp_path / "o").rglob("*.onnx"))


def test_verify_without_manifest(tmp_path):
    proc = run_cli("verify", str(tmp_path))
    assert_one_line_error(proc, "no manifest.json")


def test_a_worker_that_cannot_build_the_model_fails_its_jobs_in_one_line():
    """--jobs N: the worker keeps its initializer's failure and each job raises it as an EdgexError
    (an exception escaping the initializer would print a traceback and break the pool)."""
    import torch

    from edgex import export
    from edgex.errors import EdgexError

    export._WORKER.clear()
    try:
        export._worker_init("no-such-model", "tiny", None, 0, {}, None, torch.get_num_threads())
        with pytest.raises(EdgexError, match=r"^an export worker could not build the model: EdgexError: .*no-such-model"):
            export._worker_job(export.Job("talker_decode", "talker", "onnx", "fp32"), ())
    finally:
        export._WORKER.clear()
