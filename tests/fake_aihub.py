"""A fake Qualcomm AI Hub on 127.0.0.1 that speaks the qai-hub 0.56 client's real wire protocol.

What the client does, read from `qai_hub/public_rest_api.py`, `api_utils.py` and `client.py`:
- `api_url` comes from the client's config file (`QAIHUB_CLIENT_INI`); every API call goes to
  `<api_url>/api/v1/<path>/` with `Authorization: token <api_token>` and protobuf bodies
  (`qai_hub.public_api_pb2`, content type `application/x-protobuf`); 401 -> "Failed to
  authenticate".
- Models: POST `models/` (Model) -> GET `models/<id>/multipart_upload/` (FileUploadResponse with
  presigned part URLs) -> PUT each part to that URL (an S3 stand-in here, answering an ETag) ->
  POST `models/<id>/multipart_upload/` (FileMultipartUploadComplete). A folder model arrives zipped.
- Datasets: POST `datasets/` -> GET `datasets/<id>/upload_url/` (FileUploadURL) -> multipart form
  POST of the h5 file -> PATCH `datasets/<id>/`; downloads via `.../download_data/` (FileDownloadURL).
- Jobs: POST `jobs/` (Job with a compile_job or inference_job) -> GET `jobs/<id>/` for the state,
  `jobs/<id>/result/` (JobResult: output dataset, ProfileDetail); compiled models via
  `models/<id>/download/`.

The "device" runs the uploaded ONNX graph with ONNX Runtime on this machine, so outputs and latency
are real numbers from really running the uploaded artifact; like AI Hub's HTP compile it narrows
int64 inputs to int32. Scenarios make it fail the way AI Hub fails: a job FAILED with a reason, a
job that never finishes, or outputs perturbed by noise (a numerically broken device build).
"""

from __future__ import annotations

import email.parser
import io
import itertools
import json
import re
import tempfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import h5py
import numpy as np
import onnxruntime as ort
from qai_hub import public_api_pb2 as pb
from qai_hub.util.dataset_entries_converters import (
    dataset_entries_to_h5,
    h5_to_dataset_entries,
)

PROTOBUF = "application/x-protobuf"
DEVICES = {
    "Samsung Galaxy S25": ("15", "qualcomm-snapdragon-8-elite", "Snapdragon 8 Elite for Galaxy"),
    "Samsung Galaxy S24": ("14", "qualcomm-snapdragon-8gen3", "Snapdragon 8 Gen 3"),
    "Samsung Galaxy S23": ("13", "qualcomm-snapdragon-8gen2", "Snapdragon 8 Gen 2"),
}
ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
PB_DTYPE = {np.dtype(np.float32): pb.TENSOR_DTYPE_FLOAT32, np.dtype(np.float16): pb.TENSOR_DTYPE_FLOAT16,
            np.dtype(np.int32): pb.TENSOR_DTYPE_INT32, np.dtype(np.bool_): pb.TENSOR_DTYPE_BOOL}
RUNNING = {"compile": pb.JOB_STATE_OPTIMIZING_MODEL, "profile": pb.JOB_STATE_MEASURING_PERFORMANCE,
           "inference": pb.JOB_STATE_RUNNING_INFERENCE}


class FakeAIHub:
    """`with FakeAIHub(token=...) as hub:` serves on `hub.url`; `hub.write_config(path)` writes the
    client.ini that points the real client at it.

    fail: job kind ("compile", "profile", "inference") that ends FAILED; hang: a kind that never
    finishes; noise: relative noise added to float outputs; polls: GETs a job stays running;
    reverse_outputs: the output dataset lists the outputs in reverse order (AI Hub names them; a
    compiled model need not keep their order).
    """

    def __init__(self, token: str = "good-token", fail: str | None = None, hang: str | None = None,
                 noise: float = 0.0, polls: int = 2, reverse_outputs: bool = False):
        self.token, self.fail, self.hang, self.noise, self.polls = token, fail, hang, noise, polls
        self.reverse_outputs = reverse_outputs
        self.requests: list[tuple[str, str]] = []
        self.jobs: dict[str, dict] = {}
        self.models: dict[str, dict] = {}
        self.datasets: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-aihub-")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._tmp.cleanup()

    def write_config(self, path: Path, token: str | None = None) -> Path:
        path.write_text(f"[api]\napi_token = {self.token if token is None else token}\n"
                        f"api_url = {self.url}\nweb_url = {self.url}\nverbose = false\n")
        return path

    def new_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}{next(self._ids):05d}"

    def jobs_of(self, kind: str) -> list[dict]:
        return [j for j in self.jobs.values() if j["kind"] == kind]

    # --- the device ----------------------------------------------------------------------------

    def _model_dir(self, model_id: str) -> Path:
        """The uploaded model on disk: a single file, or the unzipped folder of a folder model."""
        model = self.models[model_id]
        if "path" not in model:
            folder = Path(self._tmp.name) / model_id
            folder.mkdir()
            if model["is_directory"]:
                with zipfile.ZipFile(io.BytesIO(model["data"])) as z:
                    z.extractall(folder)
                model["path"] = next(p for p in folder.rglob("*.onnx") if p.is_file())
            else:
                model["path"] = folder / model["name"]
                model["path"].write_bytes(model["data"])
        return model["path"]

    def _session(self, model_id: str) -> ort.InferenceSession:
        source = self.models[model_id].get("source", model_id)
        return ort.InferenceSession(str(self._model_dir(source)), providers=["CPUExecutionProvider"])

    def _target_specs(self, session) -> pb.NamedTensorTypeList:
        types = []
        for i in session.get_inputs():
            dtype = np.dtype(ORT_TO_NUMPY[i.type])
            dtype = np.dtype(np.int32) if dtype == np.int64 else dtype  # the HTP has no int64
            types.append(pb.NamedTensorType(name=i.name, tensor_type=pb.TensorType(shape=i.shape, dtype=PB_DTYPE[dtype])))
        return pb.NamedTensorTypeList(types=types)

    def _run(self, job: dict) -> None:
        """Do the job's work when it is created; its state reveals the result after `polls` GETs."""
        if job["kind"] in (self.fail, self.hang):
            return
        if job["kind"] == "compile":
            session = self._session(job["model"])
            target = self.new_id("m")
            source = self.models[job["model"]]
            self.models[target] = {"name": source["name"], "data": source["data"], "is_directory": source["is_directory"],
                                   "source": job["model"], "producer": job["id"],
                                   "filename": f"{job['id']}_target_{source['name']}" + (".zip" if source["is_directory"] else "")}
            job["target_model"] = target
            job["target_specs"] = self._target_specs(session)
            return
        session = self._session(job["model"])
        names = [i.name for i in session.get_inputs()]
        feeds_types = [ORT_TO_NUMPY[i.type] for i in session.get_inputs()]
        if job["kind"] == "profile":  # random inputs, as AI Hub profiles without a dataset
            rng = np.random.default_rng(0)
            feeds = {n: (rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(t) if t != np.int64
                         else np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.int64))
                     for n, t, i in zip(names, feeds_types, session.get_inputs())}
            times = []
            for _ in range(5):
                start = time.perf_counter()
                session.run(None, feeds)
                times.append(int((time.perf_counter() - start) * 1e6))
            job["profile"] = pb.ProfileDetail(
                major_version=1, minor_version=2, execution_time=int(np.median(times)), after_execution_peak_memory=12_345_678,
                all_execution_times=times,
                layer_details=[pb.LayerDetail(name=n.name, layer_type_name="Graph", compute_unit=pb.COMPUTE_UNIT_NPU)
                               for n in session.get_outputs()])
            return
        entries = self.datasets[job["dataset"]]["entries"]
        job["received"] = {k: [a.dtype.name for a in v] for k, v in entries.items()}
        columns = [entries[name] for name in names] if list(entries) == names else list(entries.values())
        outputs: dict[str, list[np.ndarray]] = {o.name: [] for o in session.get_outputs()}
        rng = np.random.default_rng(1)
        for sample in zip(*columns):
            feeds = {n: a.astype(t) for n, a, t in zip(names, sample, feeds_types)}
            for out, value in zip(outputs.values(), session.run(None, feeds)):
                if self.noise and np.issubdtype(value.dtype, np.floating):
                    value = value + (self.noise * np.std(value) * rng.standard_normal(value.shape)).astype(value.dtype)
                out.append(value)
        if self.reverse_outputs:
            outputs = dict(reversed(list(outputs.items())))
        dataset_id = self.new_id("d")
        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as h5f:
            dataset_entries_to_h5(outputs, h5f)
        self.datasets[dataset_id] = {"name": "outputs", "data": buffer.getvalue(), "entries": outputs}
        job["output_dataset"] = dataset_id

    def job_pb(self, job: dict) -> pb.Job:
        job["gets"] += 1
        if job["kind"] == self.hang or job["gets"] <= self.polls:
            state = RUNNING[job["kind"]]
        else:
            state = pb.JOB_STATE_FAILED if job["kind"] == self.fail else pb.JOB_STATE_DONE
        device = pb.Device(name=job["device"], os=DEVICES[job["device"]][0], attributes=_attributes(job["device"]))
        common = {"name": job["name"], "job_state": state, "device": device, "options": job["options"],
                  "model": pb.Model(model_id=job["model"], model_type=pb.MODEL_TYPE_ONNX)}
        if state == pb.JOB_STATE_FAILED:
            common["failure_reason"] = f"fake AI Hub: {job['kind']} failed (op not supported by the HTP)"
        if job["kind"] == "compile":
            compile_pb = pb.CompileJob(compile_job_id=job["id"], devices=pb.DeviceList(devices=[device]), **common)
            if "target_model" in job:
                compile_pb.target_model.CopyFrom(pb.Model(model_id=job["target_model"], model_type=pb.MODEL_TYPE_ONNX, producer_id=job["id"]))
            if state == pb.JOB_STATE_DONE:
                compile_pb.target_tensor_type_list.CopyFrom(job["target_specs"])
            return pb.Job(compile_job=compile_pb)
        inference = pb.InferenceJob(inference_job_id=job["id"], is_profiling_on=job["kind"] == "profile", **common)
        if job.get("dataset"):
            inference.dataset.CopyFrom(pb.Dataset(dataset_id=job["dataset"]))
        return pb.Job(inference_job=inference)


def _attributes(device: str) -> list[str]:
    return ["framework:qnn", "framework:onnx", "framework:tflite", "os:android", f"chipset:{DEVICES[device][1]}",
            "vendor:samsung", "htp-supports-fp16:true"]


def _handler(hub: FakeAIHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while (size := int(self.rfile.readline().strip(), 16)) > 0:
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, status: int, body: bytes = b"", content_type: str = PROTOBUF, headers: dict | None = None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _proto(self, message):
            self._send(200, message.SerializeToString())

        def _dispatch(self, method: str):
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            body = self._body()
            hub.requests.append((method, url.path))
            if url.path.startswith("/s3/"):
                return self._storage(method, url.path, body)
            if not url.path.startswith("/api/v1/"):
                return self._send(404, b"not found", "text/plain")
            if self.headers.get("Authorization") != f"token {hub.token}":
                return self._send(401, json.dumps({"detail": "Invalid token."}).encode(), "application/json")
            route = url.path.removeprefix("/api/v1/").strip("/")
            for pattern, handler in ROUTES:
                match = re.fullmatch(pattern, f"{method} {route}")
                if match:
                    try:
                        return handler(self, body, query, *match.groups())
                    except Exception as exc:  # a 4xx, which the client does not retry: fail fast and say why
                        return self._send(400, f"fake AI Hub: {type(exc).__name__}: {exc}".encode(), "text/plain")
            return self._send(404, f"no route {method} {route}".encode(), "text/plain")

        def _storage(self, method: str, path: str, body: bytes):
            parts = path.strip("/").split("/")
            if method == "PUT" and parts[1] == "models":  # one part of a multipart upload
                hub.models[parts[2]].setdefault("parts", {})[int(parts[3])] = body
                return self._send(200, b"", "text/plain", {"ETag": f'"etag-{parts[2]}-{parts[3]}"'})
            if method == "POST" and parts[1] == "datasets":  # presigned form POST of the h5 file
                message = email.parser.BytesParser().parsebytes(
                    f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + body)
                data = next(p.get_payload(decode=True) for p in message.get_payload() if p.get_param("name", header="content-disposition") == "file")
                dataset = hub.datasets[parts[2]]
                dataset["data"] = data
                with h5py.File(io.BytesIO(data), "r") as h5f:
                    dataset["entries"] = h5_to_dataset_entries(h5f)
                return self._send(204, b"", "text/plain")
            if method == "GET" and parts[1] == "models":
                return self._send(200, hub.models[parts[2]]["data"], "application/octet-stream")
            if method == "GET" and parts[1] == "datasets":
                return self._send(200, hub.datasets[parts[2]]["data"], "application/octet-stream")
            return self._send(404, b"", "text/plain")

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

        def do_PUT(self):
            self._dispatch("PUT")

        def do_PATCH(self):
            self._dispatch("PATCH")

        # --- API routes ----------------------------------------------------------------------

        def user(self, body, query):
            self._proto(pb.User(id=1, email="edgex@example.com"))

        def devices(self, body, query):
            names = [query["name"]] if query.get("name") else list(DEVICES)
            found = [pb.Device(name=n, os=DEVICES[n][0], attributes=_attributes(n), soc_description=DEVICES[n][2])
                     for n in names if n in DEVICES]
            self._proto(pb.DeviceList(devices=found, total_query_count=len(found)))

        def create_model(self, body, query):
            model = pb.Model.FromString(body)
            model_id = hub.new_id("m")
            hub.models[model_id] = {"name": model.name, "type": model.model_type, "is_directory": model.is_directory}
            self._proto(pb.CreateUpdateResponse(id=model_id))

        def upload_urls(self, body, query, model_id):
            size = int(query["file_size"])
            hub.models[model_id]["size"] = size
            self._proto(pb.FileUploadResponse(multipart_url=pb.FileMultipartUploadURL(
                urls=[f"{hub.url}/s3/models/{model_id}/1"], upload_id=f"up-{model_id}", max_part_size=max(size, 1))))

        def complete_upload(self, body, query, model_id):
            done = pb.FileMultipartUploadComplete.FromString(body)
            model = hub.models[model_id]
            assert list(done.etags) == [f'"etag-{model_id}-1"'], done.etags
            model["data"] = b"".join(model["parts"][k] for k in sorted(model["parts"]))
            assert len(model["data"]) == model["size"]
            self._proto(pb.CreateUpdateResponse(id=model_id))

        def get_model(self, body, query, model_id):
            model = hub.models[model_id]
            self._proto(pb.Model(model_id=model_id, name=model["name"], model_type=pb.MODEL_TYPE_ONNX,
                                 producer_id=model.get("producer", "")))

        def download_model(self, body, query, model_id):
            filename = hub.models[model_id].get("filename", hub.models[model_id]["name"])
            self._proto(pb.FileDownloadResponse(url=pb.FileDownloadURL(url=f"{hub.url}/s3/models/{model_id}", filename=filename)))

        def create_job(self, body, query):
            job_pb = pb.Job.FromString(body)
            kind = job_pb.WhichOneof("job")
            if kind == "compile_job":
                spec = job_pb.compile_job
                job = {"kind": "compile", "device": spec.devices.devices[0].name}
            else:
                spec = job_pb.inference_job
                job = {"kind": "profile" if spec.is_profiling_on else "inference", "device": spec.device.name,
                       "dataset": spec.dataset.dataset_id}
            job |= {"id": hub.new_id("j"), "name": spec.name, "options": spec.options, "model": spec.model.model_id, "gets": 0}
            hub.jobs[job["id"]] = job
            hub._run(job)
            self._proto(pb.CreateUpdateResponse(id=job["id"]))

        def get_job(self, body, query, job_id):
            self._proto(hub.job_pb(hub.jobs[job_id]))

        def job_result(self, body, query, job_id):
            job = hub.jobs[job_id]
            result = pb.InferenceJobResult(inference_job_id=job_id, output_dataset_id=job.get("output_dataset", ""))
            if "profile" in job:
                result.detail.CopyFrom(job["profile"])
            self._proto(pb.JobResult(inference_job_result=result))

        def create_dataset(self, body, query):
            dataset = pb.Dataset.FromString(body)
            dataset_id = hub.new_id("d")
            hub.datasets[dataset_id] = {"name": dataset.name}
            self._proto(pb.CreateUpdateResponse(id=dataset_id))

        def dataset_upload_url(self, body, query, dataset_id):
            self._proto(pb.FileUploadResponse(url=pb.FileUploadURL(url=f"{hub.url}/s3/datasets/{dataset_id}", file_field_name="file")))

        def confirm_dataset(self, body, query, dataset_id):
            assert pb.Dataset.FromString(body).file_upload_complete and "entries" in hub.datasets[dataset_id]
            self._proto(pb.CreateUpdateResponse(id=dataset_id))

        def get_dataset(self, body, query, dataset_id):
            self._proto(pb.Dataset(dataset_id=dataset_id, name=hub.datasets[dataset_id]["name"], permanent=True))

        def download_dataset(self, body, query, dataset_id):
            self._proto(pb.FileDownloadResponse(url=pb.FileDownloadURL(url=f"{hub.url}/s3/datasets/{dataset_id}", filename=f"{dataset_id}.h5")))

    ROUTES = [
        (r"GET users/auth/user", Handler.user),
        (r"GET devices", Handler.devices),
        (r"POST models", Handler.create_model),
        (r"GET models/(\w+)/multipart_upload", Handler.upload_urls),
        (r"POST models/(\w+)/multipart_upload", Handler.complete_upload),
        (r"GET models/(\w+)/download", Handler.download_model),
        (r"GET models/(\w+)", Handler.get_model),
        (r"POST jobs", Handler.create_job),
        (r"GET jobs/(\w+)/result", Handler.job_result),
        (r"GET jobs/(\w+)", Handler.get_job),
        (r"POST datasets", Handler.create_dataset),
        (r"GET datasets/(\w+)/upload_url", Handler.dataset_upload_url),
        (r"GET datasets/(\w+)/download_data", Handler.download_dataset),
        (r"PATCH datasets/(\w+)", Handler.confirm_dataset),
        (r"GET datasets/(\w+)", Handler.get_dataset),
    ]
    return Handler
