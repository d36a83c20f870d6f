"""Contract tests: what an artifact promises its on-device runner (names, shapes, dtypes, methods)."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import cpu_export_artifacts
from edgex.recipes.qwen3_tts.facts import ROLES

ET_DTYPES = {4: "int64", 5: "float16", 6: "float32"}


@pytest.fixture(scope="module")
def exported(cpu_export):
    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = out / "qwen3-tts" / "cpu"
    return root, json.loads((root / "manifest.json").read_text())


def _float(dtype: str, io: str) -> str:
    return io if dtype.startswith("float") else dtype


@pytest.mark.parametrize("component", sorted({c for c, f, _ in cpu_export_artifacts(ROLES) if f == "pte"}))
def test_pte_method_signature_matches_spec(exported, component):
    from executorch.runtime import Runtime

    root, manifest = exported
    programs = [a for a in manifest["artifacts"] if a["component"] == component and a["format"] == "pte"]
    assert programs
    for a in programs:
        program = Runtime.get().load_program(root / a["files"][0]["path"])
        assert "forward" in program.method_names
        meta = program.metadata("forward")
        assert meta.num_inputs() == len(a["inputs"]) and meta.num_outputs() == len(a["outputs"])
        for i, spec in enumerate(a["inputs"]):
            tm = meta.input_tensor_meta(i)
            assert list(tm.sizes()) == spec["shape"], (component, spec["name"])
            assert ET_DTYPES[tm.dtype()] == _float(spec["dtype"], a["io_float_dtype"]), (component, spec["name"])
        for i, spec in enumerate(a["outputs"]):
            tm = meta.output_tensor_meta(i)
            assert list(tm.sizes()) == spec["shape"], (component, spec["name"])
            assert ET_DTYPES[tm.dtype()] == _float(spec["dtype"], a["io_float_dtype"]), (component, spec["name"])


@pytest.mark.parametrize("component", list(ROLES))
def test_onnx_io_names_shapes_and_dtypes_match_spec(exported, component):
    root, manifest = exported
    for a in manifest["artifacts"]:
        if a["component"] != component or a["format"] != "onnx":
            continue
        model = onnx.load(root / a["files"][0]["path"], load_external_data=False)
        for values, specs in ((model.graph.input, _as_fed(model, a["inputs"])), (model.graph.output, a["outputs"])):
            assert [v.name for v in values] == [s["name"] for s in specs]
            for v, spec in zip(values, specs):
                dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
                assert dims == spec["shape"], (component, spec["name"])
                np_type = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
                assert np.dtype(np_type).name == _float(spec["dtype"], a["io_float_dtype"])


def _as_fed(model, specs: list[dict]) -> list[dict]:
    """The input specs as the ONNX file takes them: a stacked input the exporter sliced (named in the
    model's `edgex.sliced_inputs`) is one input per index of its first axis, `NAME.i`."""
    sliced = json.loads({p.key: p.value for p in model.metadata_props}.get("edgex.sliced_inputs", "{}"))
    fed = []
    for spec in specs:
        count = sliced.pop(spec["name"], None)
        assert count in (None, spec["shape"][0]), spec
        fed += [spec] if count is None else [dict(spec, name=f"{spec['name']}.{i}", shape=spec["shape"][1:]) for i in range(count)]
    assert not sliced, f"sliced inputs the spec does not have: {sliced}"
    return fed


def test_component_metadata_a_runner_needs(exported):
    _, manifest = exported
    meta = {a["component"]: a["metadata"] for a in manifest["artifacts"]}
    assert meta["code2wav"] == {"context_frames": 72, "new_frames": 25}
    assert meta["latent2wav"]["context_frames"] == 12
    assert meta["talker_decode"]["max_context"] == 64


def test_onnx_files_name_no_folder_of_the_machine_that_made_them(exported):
    """The same export from another checkout or node is the same bytes: no node carries the Python
    stack that made it (absolute paths of the source and of site-packages)."""
    import sys

    import edgex

    root, manifest = exported
    folders = {str(Path(edgex.__file__).resolve().parent.parent), sys.prefix, str(Path(np.__file__).resolve().parent.parent)}
    files = [root / a["files"][0]["path"] for a in manifest["artifacts"] if a["format"] == "onnx"]
    assert files
    for path in files:
        data = path.read_bytes()
        assert not [f for f in folders if f.encode() in data], path.name
        model = onnx.load(path, load_external_data=False)
        assert not [p.key for n in model.graph.node for p in n.metadata_props if p.key == "pkg.torch.onnx.stack_trace"]
        assert any(p.key == "pkg.torch.onnx.name_scopes" for n in model.graph.node for p in n.metadata_props)
