"""Sharing on the hub: `model.push_to_hub` and `keras-transformers push`
upload a preset, a Hugging Face export or a PEFT adapter in one commit,
and refuse with a fix what they should not upload.

There is no network here: `huggingface_hub.HfApi` is replaced by `FakeApi`,
which records its calls and keeps each repository's branches as files in
memory, as the hub would after the same calls.
"""

import fnmatch
import json
import shutil
import types
from pathlib import Path

import huggingface_hub
import keras
import numpy as np
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from keras_transformers import cli
from keras_transformers.hub import HubAccessError
from keras_transformers.hub_upload import HubUploadError, push
from keras_transformers.models import GPTCausalLM, GPTClassifier

try:  # the HTTP client of huggingface_hub: httpx2 in 2.x, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx

TOKEN = "hf_test_token"


def _http_error(cls, status, message="error"):
    request = httpx.Request("POST", "https://huggingface.co/api/repos/create")
    return cls(message, response=httpx.Response(status, request=request))


class FakeApi:
    """The `HfApi` methods a push uses, over `repos`:
    `{repo_id: {"private": bool, "branches": {name: {path: bytes}}}}`."""

    def __init__(self, hub, token=None, **kwargs):
        self.hub = hub
        hub.tokens.append(token)

    def _branch(self, repo_id, revision):
        if repo_id not in self.hub.repos:
            raise _http_error(RepositoryNotFoundError, 404, "Repository Not Found")
        branches = self.hub.repos[repo_id]["branches"]
        if (revision or "main") not in branches:
            raise _http_error(RevisionNotFoundError, 404, "Revision Not Found")
        return branches[revision or "main"]

    def list_repo_files(self, repo_id, revision=None, **kwargs):
        self.hub.calls.append(("list_repo_files", repo_id, revision))
        return sorted(self._branch(repo_id, revision))

    def hf_hub_download(self, repo_id, filename, revision=None, **kwargs):
        self.hub.calls.append(("hf_hub_download", repo_id, filename))
        files = self._branch(repo_id, revision)
        if filename not in files:
            raise _http_error(EntryNotFoundError, 404, "Entry Not Found")
        path = self.hub.downloads / repo_id / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[filename])
        return str(path)

    def create_repo(self, repo_id, private=None, exist_ok=False, repo_type=None):
        self.hub.calls.append(("create_repo", repo_id, private, exist_ok))
        if self.hub.fail is not None:
            raise self.hub.fail
        if repo_id not in self.hub.repos:
            initial = {".gitattributes": b"*.h5 filter=lfs\n"}
            self.hub.repos[repo_id] = {
                "private": private,
                "branches": {"main": initial},
            }

    def create_branch(self, repo_id, branch, exist_ok=False, **kwargs):
        self.hub.calls.append(("create_branch", repo_id, branch))
        branches = self.hub.repos[repo_id]["branches"]
        branches.setdefault(branch, dict(branches["main"]))

    def upload_folder(
        self,
        repo_id,
        folder_path,
        commit_message=None,
        revision=None,
        delete_patterns=None,
        **kwargs,
    ):
        self.hub.calls.append(("upload_folder", repo_id, revision, commit_message))
        files = self._branch(repo_id, revision)
        for pattern in delete_patterns or ():
            for name in [n for n in files if fnmatch.fnmatch(n, pattern)]:
                if name != ".gitattributes":
                    del files[name]
        root = Path(folder_path)
        for path in root.rglob("*"):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
        url = f"https://huggingface.co/{repo_id}/commit/abc123"
        return types.SimpleNamespace(commit_url=url, oid="abc123")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A fresh fake hub, with HF_TOKEN set and no stored login."""
    state = types.SimpleNamespace(
        repos={}, calls=[], tokens=[], fail=None, downloads=tmp_path / "downloads"
    )
    monkeypatch.setattr(
        huggingface_hub, "HfApi", lambda **kwargs: FakeApi(state, **kwargs)
    )
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return state


def _files(directory):
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _repo(hub, repo_id, branch="main"):
    files = dict(hub.repos[repo_id]["branches"][branch])
    files.pop(".gitattributes", None)
    return files


@pytest.fixture(scope="module")
def lm():
    return GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1)


@pytest.fixture(scope="module")
def preset(lm, tmp_path_factory):
    directory = tmp_path_factory.mktemp("preset") / "lm"
    lm.save_to_preset(directory)
    return directory


# ------------------------------------------------------------- what goes up
def test_push_a_preset_directory(hub, preset):
    info = push(preset, "org/lm", private=True, commit_message="First version")
    assert _repo(hub, "org/lm") == _files(preset)
    assert hub.repos["org/lm"]["private"] is True
    assert ("upload_folder", "org/lm", None, "First version") in hub.calls
    assert hub.tokens == [TOKEN]
    assert info.commit_url.endswith("/commit/abc123")


def test_model_push_to_hub_saves_and_uploads_a_preset(hub, lm, tmp_path):
    lm.push_to_hub("org/lm", token="hf_argument", private=False)
    assert hub.tokens == ["hf_argument"]  # the argument wins over HF_TOKEN
    assert hub.repos["org/lm"]["private"] is False
    (commit,) = [call for call in hub.calls if call[0] == "upload_folder"]
    assert commit[3] == "Upload preset with keras_transformers"
    # The repository loads back as the model it came from.
    local = tmp_path / "clone"
    for name, data in _repo(hub, "org/lm").items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    ids = np.array([[1, 2, 3, 4]])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(GPTCausalLM.from_preset(str(local))(ids)),
        keras.ops.convert_to_numpy(lm(ids)),
        atol=1e-6,
    )


def test_push_hf_export_and_adapter(hub, tmp_path):
    lm = GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1)
    lm.push_to_hub("org/lm-hf", format="hf", commit_message="HF export")
    files = _repo(hub, "org/lm-hf")
    assert {"config.json", "model.safetensors"} <= set(files)
    assert json.loads(files["config.json"])["model_type"] == "llama"
    lm.enable_lora(2)
    lm.push_to_hub("org/lm-lora", format="adapter")
    assert set(_repo(hub, "org/lm-lora")) == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    lm.save_adapter(tmp_path / "adapter")
    push(tmp_path / "adapter", "hf://org/lm-lora")  # the same kind: an update
    assert _repo(hub, "org/lm-lora") == _files(tmp_path / "adapter")
    with pytest.raises(ValueError, match="format.*'preset'.*Received: 'keras'"):
        lm.push_to_hub("org/x", format="keras")


def test_update_replaces_stale_files_and_keeps_the_readme(hub, preset):
    push(preset, "org/lm")
    files = hub.repos["org/lm"]["branches"]["main"]
    files["README.md"] = b"# My model\n"
    files["tokenizer/old.json"] = b"{}"  # a file of an older save
    push(preset, "org/lm", commit_message="Second version")
    assert _repo(hub, "org/lm") == {**_files(preset), "README.md": b"# My model\n"}


def test_branch_from_handle_or_revision(hub, preset):
    push(preset, "org/lm")
    push(preset, "hf://org/lm@dev")
    assert ("create_branch", "org/lm", "dev") in hub.calls
    assert _repo(hub, "org/lm", "dev") == _files(preset)
    push(preset, "org/new", revision="v1")  # a new repository, then its branch
    assert _repo(hub, "org/new", "v1") == _files(preset)
    with pytest.raises(HubUploadError, match="branch 'dev' but revision='v2'"):
        push(preset, "hf://org/lm@dev", revision="v2")


def test_cli_push(hub, preset, capsys):
    argv = ["push", str(preset), "hf://org/lm", "--private", "--message", "From CLI"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.strip() == (
        "https://huggingface.co/org/lm/commit/abc123"
    )
    assert hub.repos["org/lm"]["private"] is True
    assert ("upload_folder", "org/lm", None, "From CLI") in hub.calls
    assert _repo(hub, "org/lm") == _files(preset)


# ------------------------------------------------------------------ errors
def test_no_token(hub, preset, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubAccessError, match="no hub token.*HF_TOKEN.*hf auth login"):
        push(preset, "org/lm")
    assert cli.main(["push", str(preset), "hf://org/lm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-transformers push: error: Cannot push to org/lm: no")
    assert err.count("\n") == 1 and not hub.calls


def test_token_of_hf_auth_login(hub, preset, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN")
    stored = tmp_path / "stored-token"
    stored.write_text("hf_stored_token\n")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(stored))
    push(preset, "org/lm")
    assert hub.tokens == ["hf_stored_token"]


def test_offline(hub, preset, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubAccessError, match="HF_HUB_OFFLINE is set.*Unset"):
        push(preset, "org/lm")
    assert not hub.calls


def test_not_a_preset_export_or_adapter(hub, preset, tmp_path):
    def refused(directory, match):
        with pytest.raises(HubUploadError, match=match):
            push(directory, "org/lm")

    refused(tmp_path / "missing", "is not a directory.*save_to_preset")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("a,b\n")
    refused(tmp_path / "data", "no config.json.*not a preset.*save_to_preset")
    (tmp_path / "data" / "config.json").write_text('{"lr": 0.1}')
    refused(tmp_path / "data", "neither `model_type`.*nor `family`")
    (tmp_path / "data" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "data" / "pytorch_model.bin").write_bytes(b"pickle")
    refused(tmp_path / "data", "without model.safetensors.*export_hf")
    (tmp_path / "data" / "adapter_config.json").write_text("{}")
    refused(tmp_path / "data", "no adapter_model.safetensors.*save_adapter")
    copy = tmp_path / "copy"
    shutil.copytree(preset, copy)
    (copy / "model.weights.h5").write_bytes(b"not the saved weights")
    refused(copy, "Not pushing.*model.weights.h5 does not match")
    (copy / "model.weights.h5").unlink()
    refused(copy, r"incomplete preset: it lacks \['model.weights.h5'\]")
    assert not hub.calls


def test_repository_with_other_content(hub, preset):
    hub.repos["org/data"] = {
        "private": False,
        "branches": {"main": {"README.md": b"", "train.csv": b"a,b\n"}},
    }
    with pytest.raises(
        HubUploadError,
        match="org/data already holds files that are not a preset.*train.csv.*"
        "overwrite=True.*--overwrite",
    ):
        push(preset, "org/data")
    assert not [call for call in hub.calls if call[0] == "upload_folder"]
    push(preset, "org/data", overwrite=True)
    assert _repo(hub, "org/data") == {**_files(preset), "README.md": b""}


def test_repository_with_another_model(hub, preset, capsys):
    config = json.loads((preset / "config.json").read_text())
    other = {**config, "class_name": GPTClassifier.__name__}
    hub.repos["org/lm"] = {
        "private": False,
        "branches": {"main": {"config.json": json.dumps(other).encode()}},
    }
    with pytest.raises(
        HubUploadError,
        match="already holds a preset \\(class_name='GPTClassifier'.*this is a "
        "preset \\(class_name='GPTCausalLM'",
    ):
        push(preset, "org/lm")
    assert cli.main(["push", str(preset), "hf://org/lm"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["push", str(preset), "hf://org/lm", "--overwrite"]) == 0
    assert _repo(hub, "org/lm") == _files(preset)
    hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    hub.repos["org/hf"] = {
        "private": False,
        "branches": {"main": {"config.json": json.dumps(hf).encode()}},
    }
    with pytest.raises(HubUploadError, match="holds a Hugging Face model.*'llama'"):
        push(preset, "org/hf")


def test_hub_errors_are_translated(hub, preset):
    hub.fail = _http_error(HfHubHTTPError, 403, "Forbidden")
    with pytest.raises(HubAccessError, match="HTTP 403.*write access to it"):
        push(preset, "someone-else/lm")
    hub.fail = _http_error(HfHubHTTPError, 401, "Unauthorized")
    with pytest.raises(HubAccessError, match="HTTP 401.*rejected the token"):
        push(preset, "org/lm")
    hub.fail = httpx.ConnectError("Connection refused")
    with pytest.raises(HubAccessError, match="could not be reached.*ConnectError"):
        push(preset, "org/lm")


def test_model_type_needs_format_hf(lm):
    with pytest.raises(ValueError, match="format='hf'"):
        lm.push_to_hub("org/lm", model_type="llama")
