"""The node's model cache: Hub snapshots downloaded with huggingface_hub, resumable, with progress.

The cache uses huggingface_hub's own layout under `root` (``models--<org>--<name>/{blobs,refs,snapshots}``),
so an interrupted download resumes from its ``.incomplete`` blob. A snapshot counts as cached only after
`download` finished: it then writes ``cleverthis.json`` next to the snapshots, recording each downloaded
revision's commit, size, file count and when it was last used (that is what `inventory` reports).

A cache budget (`budget_bytes`: ``CLEVERTHIS_MODEL_CACHE_BUDGET_MB`` at start, then what each model.download
says, kept in ``cleverthis-budget.json``) is enforced after each download: the least recently used snapshots
that no endpoint serves from (`in_use`) are evicted until the cache fits it. `evict` removes one on request.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import tqdm as hf_tqdm

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.protocol import CachedModel, ModelDownloadPayload, ModelDownloadResult, ModelEvictPayload, ModelEvictResult

DEFAULT_ROOT = Path("/var/cache/cleverthis/models")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
MODEL_ID_RE = re.compile(rf"^(?:{_NAME}/)?{_NAME}$")
REVISION_RE = re.compile(protocol.REVISION_RE)  # (its length is bounded by model.download's payload rule)
MARKER = "cleverthis.json"
BUDGET_FILE = "cleverthis-budget.json"
LOCAL_COMMIT = "local"  # the snapshot name of a registered local folder
DISK_FREE_STEP = 256 * 1024 * 1024  # what the inventory's disk free is rounded to
_PROGRESS_INTERVAL_S = 0.5


def repo_folder(model_id: str) -> str:
    """huggingface_hub's cache folder name for a model repository."""
    return "models--" + model_id.replace("/", "--")


def validate_model_ref(model_id: str, revision: str) -> None:
    """`CommandFailed("invalid_payload")` unless `model_id` looks like ``[org/]name`` and `revision` is sane."""
    if not MODEL_ID_RE.match(model_id) or ".." in model_id or "--" in model_id:
        raise CommandFailed("invalid_payload", f"{model_id!r} is not a Hub model id (expected org/name)")
    if not REVISION_RE.match(revision) or ".." in revision:
        raise CommandFailed("invalid_payload", f"{revision!r} is not a valid revision")


class _Reporter:
    """Aggregates huggingface_hub's progress bars into throttled `progress(...)` calls."""

    def __init__(self, progress: ProgressFn, model_id: str) -> None:
        self.progress = progress
        self.model_id = model_id
        self.bytes_done = 0
        self.bytes_total = 0
        self.files_done = 0
        self.files_total = 0
        self._last = 0.0
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def report(self, *, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last < _PROGRESS_INTERVAL_S:
                return
            self._last = now
            percent = round(100.0 * self.bytes_done / self.bytes_total, 1) if self.bytes_total else None
            data = {
                "bytes_done": self.bytes_done,
                "bytes_total": self.bytes_total,
                "files_done": self.files_done,
                "files_total": self.files_total,
                # the mean rate since the download started (bytes resumed from a partial blob not counted)
                "bytes_per_s": round(self.bytes_done / max(now - self._started, 1e-3)),
            }
        self.progress(f"downloading {self.model_id}", percent=percent, data=data)

    def bar_class(self) -> type:
        """A silent tqdm subclass whose updates feed this reporter (bytes bar and files bar)."""
        reporter = self

        class Bar(hf_tqdm):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["disable"] = True
                self._is_bytes = kwargs.get("unit") == "B"
                self._is_files = not self._is_bytes and (kwargs.get("desc") or "").startswith("Fetching")
                super().__init__(*args, **kwargs)
                if self._is_files and kwargs.get("total"):
                    reporter.files_total = int(kwargs["total"])

            def update(self, n: float | None = 1) -> bool | None:
                if self._is_bytes and n:
                    with reporter._lock:
                        reporter.bytes_done += int(n)
                        reporter.bytes_total = max(int(self.total or 0), reporter.bytes_done)
                    reporter.report()
                return super().update(n)

            def __iter__(self) -> Any:
                for item in super().__iter__():
                    if self._is_files:
                        reporter.files_done += 1
                        reporter.report()
                    yield item

        return Bar


class ModelCache:
    """Downloads Hub snapshots into `root` and answers what is cached (thread-safe)."""

    def __init__(
        self, root: Path | str | None = None, *, endpoint: str | None = None, token: str | None = None
    ) -> None:
        self.root = Path(root or os.environ.get("CLEVERTHIS_MODEL_CACHE") or DEFAULT_ROOT)
        # None: huggingface_hub's default, i.e. HF_ENDPOINT or huggingface.co (read now, not at its import).
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.token = token or os.environ.get("HF_TOKEN") or None
        self._lock = threading.RLock()
        # (model_id, revision) pairs an endpoint serves from now: never evicted (set by the agent's runner)
        self.in_use: Callable[[], set[tuple[str, str]]] = set
        self.budget_bytes = self._read_budget()

    # ---- queries

    def path_for(self, model_id: str, revision: str = "main") -> Path | None:
        """The snapshot folder of a completed download of `model_id` at `revision`, or None."""
        entry = self._marker(model_id).get(revision)
        if entry is None:
            # A commit sha downloaded under a branch name counts too.
            entry = next((e for e in self._marker(model_id).values() if e.get("commit") == revision), None)
        if entry is None:
            return None
        path = self.root / repo_folder(model_id) / "snapshots" / entry["commit"]
        return path if path.is_dir() else None

    def inventory(self) -> list[CachedModel]:
        """Every completed snapshot in the cache."""
        models: list[CachedModel] = []
        if not self.root.is_dir():
            return models
        for marker in sorted(self.root.glob(f"models--*/{MARKER}")):
            try:
                data = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue
            model_id = data.get("model_id", "")
            for revision, entry in sorted(data.get("revisions", {}).items()):
                path = marker.parent / "snapshots" / entry["commit"]
                if path.is_dir():
                    models.append(
                        CachedModel(
                            model_id=model_id,
                            revision=revision,
                            path=str(path),
                            size_bytes=entry.get("size_bytes", 0),
                            last_used_at=float(entry.get("last_used", 0.0)),
                        )
                    )
        return models

    def disk_free_bytes(self) -> int:
        """Free bytes on the cache's disk (of its nearest existing folder; 0 when none can be read), rounded
        down to DISK_FREE_STEP so an inventory changes only when the disk does, not with every log line."""
        folder = self.root
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            return 0
        return free - free % DISK_FREE_STEP

    def touch(self, model_id: str, revision: str) -> None:
        """An endpoint starts from this snapshot: it becomes the most recently used."""
        with self._lock:
            revisions = self._marker(model_id)
            for name, entry in revisions.items():
                if name == revision or entry.get("commit") == revision:
                    entry["last_used"] = time.time()
            if revisions:
                self._write_marker(model_id, revisions)

    # ---- model.download

    def download(self, payload: ModelDownloadPayload, progress: ProgressFn) -> ModelDownloadResult:
        """Snapshot the repository (only missing or partial files are fetched); returns path and sizes."""
        validate_model_ref(payload.model_id, payload.revision)
        if payload.local_path:
            return self._adopt(payload, progress)
        reporter = _Reporter(progress, payload.model_id)
        progress(f"resolving {payload.model_id}@{payload.revision}", percent=0.0)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            path = snapshot_download(
                payload.model_id,
                revision=payload.revision,
                cache_dir=str(self.root),
                endpoint=self.endpoint,
                token=self.token or False,
                allow_patterns=list(payload.allow_patterns) or None,
                tqdm_class=reporter.bar_class(),
                max_workers=4,
            )
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            kind = "gated or private" if isinstance(exc, GatedRepoError) else "not found"
            raise CommandFailed(
                "model_not_found", f"{payload.model_id}@{payload.revision} {kind} on the Hub", model_id=payload.model_id
            ) from None
        except (LocalEntryNotFoundError, httpx2.HTTPError, HfHubHTTPError, OSError) as exc:
            raise CommandFailed(
                "hub_unreachable",
                f"downloading {payload.model_id} failed: {_first_line(exc)}",
                model_id=payload.model_id,
            ) from None
        snapshot = Path(path)
        files = [p for p in snapshot.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        commit = snapshot.name
        self._record(payload.model_id, payload.revision, commit=commit, size_bytes=size, files=len(files))
        reporter.files_done = reporter.files_total = len(files)
        reporter.bytes_done = reporter.bytes_total = max(reporter.bytes_total, reporter.bytes_done)
        progress(f"downloaded {payload.model_id}", percent=100.0, data={"files": len(files), "size_bytes": size})
        self._write_budget(payload.cache_budget_bytes)
        evicted = self.enforce_budget(keep={(payload.model_id, payload.revision)})
        return ModelDownloadResult(
            model_id=payload.model_id,
            revision=payload.revision,
            commit=commit,
            path=str(snapshot),
            size_bytes=size,
            files=len(files),
            evicted=[f"{m.model_id}@{m.revision}" for m in evicted] or None,
        )

    def _adopt(self, payload: ModelDownloadPayload, progress: ProgressFn) -> ModelDownloadResult:
        """Register a folder already on the node as `model_id`: its snapshot is a link to it (nothing is copied;
        evicting it removes the link, never the folder). The folder must hold a model (a config.json)."""
        folder = Path(payload.local_path)
        if ".." in folder.parts or not folder.is_absolute():
            raise CommandFailed("invalid_payload", f"{payload.local_path!r} is not an absolute folder path")
        if not (folder / "config.json").is_file():
            raise CommandFailed(
                "weights_missing",
                f"{payload.local_path} holds no model on this node (no config.json there)",
                model_id=payload.model_id,
            )
        files = [p for p in folder.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        snapshots = self.root / repo_folder(payload.model_id) / "snapshots"
        snapshots.mkdir(parents=True, exist_ok=True)
        link = snapshots / LOCAL_COMMIT
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(folder, target_is_directory=True)
        self._record(payload.model_id, payload.revision, commit=LOCAL_COMMIT, size_bytes=size, files=len(files))
        progress(f"registered {payload.local_path} as {payload.model_id}", percent=100.0, data={"size_bytes": size})
        self._write_budget(payload.cache_budget_bytes)
        evicted = self.enforce_budget(keep={(payload.model_id, payload.revision)})
        return ModelDownloadResult(
            model_id=payload.model_id,
            revision=payload.revision,
            commit=LOCAL_COMMIT,
            path=str(link),
            size_bytes=size,
            files=len(files),
            evicted=[f"{m.model_id}@{m.revision}" for m in evicted] or None,
        )

    # ---- eviction and the budget

    def evict(self, payload: ModelEvictPayload) -> ModelEvictResult:
        """Remove one snapshot; `CommandFailed("conflict")` while an endpoint serves from it."""
        validate_model_ref(payload.model_id, payload.revision)
        with self._lock:
            if (payload.model_id, payload.revision) in self.in_use():
                raise CommandFailed(
                    "conflict",
                    f"{payload.model_id}@{payload.revision} is in use by an endpoint on this node; stop it first",
                    model_id=payload.model_id,
                )
            freed = self._remove(payload.model_id, payload.revision)
        return ModelEvictResult(
            model_id=payload.model_id, revision=payload.revision, evicted=freed is not None, freed_bytes=freed or 0
        )

    def enforce_budget(self, *, keep: Collection[tuple[str, str]] = ()) -> list[CachedModel]:
        """Evict the least recently used snapshots (not in use, not in `keep`) until the cache fits its
        budget; returns what left, oldest first. Nothing happens without a budget."""
        if self.budget_bytes <= 0:
            return []
        evicted: list[CachedModel] = []
        with self._lock:
            cached = self.inventory()
            total = sum(m.size_bytes for m in cached)
            spared = set(keep) | self.in_use()
            for m in sorted(cached, key=lambda m: (m.last_used_at, m.model_id, m.revision)):
                if total <= self.budget_bytes:
                    break
                if (m.model_id, m.revision) in spared:
                    continue
                if self._remove(m.model_id, m.revision) is not None:
                    total -= m.size_bytes
                    evicted.append(m)
        return evicted

    def _remove(self, model_id: str, revision: str) -> int | None:
        """Drop `revision` from the marker and its snapshot (the whole repository folder once no revision is
        left); the bytes it counted, or None when it was not cached."""
        revisions = self._marker(model_id)
        entry = revisions.pop(revision, None)
        if entry is None:
            return None
        folder = self.root / repo_folder(model_id)
        if not revisions:
            shutil.rmtree(folder, ignore_errors=True)
            return int(entry.get("size_bytes", 0))
        if all(e.get("commit") != entry["commit"] for e in revisions.values()):
            snapshot = folder / "snapshots" / entry["commit"]
            if snapshot.is_symlink():  # a registered local folder: the link goes, never the folder
                snapshot.unlink()
            else:
                shutil.rmtree(snapshot, ignore_errors=True)
        self._write_marker(model_id, revisions)
        return int(entry.get("size_bytes", 0))

    def _read_budget(self) -> int:
        """The budget the control plane last set, else ``CLEVERTHIS_MODEL_CACHE_BUDGET_MB`` (0: none)."""
        try:
            return max(int(json.loads((self.root / BUDGET_FILE).read_text())["budget_bytes"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            try:
                return max(int(os.environ.get("CLEVERTHIS_MODEL_CACHE_BUDGET_MB") or 0), 0) * 1024 * 1024
            except ValueError:
                return 0

    def _write_budget(self, budget_bytes: int) -> None:
        """The control plane's budget for this node (0: it sets none, the agent's own setting applies)."""
        path = self.root / BUDGET_FILE
        if budget_bytes > 0:
            path.write_text(json.dumps({"budget_bytes": budget_bytes}))
        else:
            path.unlink(missing_ok=True)
        self.budget_bytes = self._read_budget()

    # ---- completion marker

    def _marker(self, model_id: str) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads((self.root / repo_folder(model_id) / MARKER).read_text())
        except (OSError, ValueError):
            return {}
        return data.get("revisions", {})

    def _record(self, model_id: str, revision: str, *, commit: str, size_bytes: int, files: int) -> None:
        with self._lock:
            revisions = self._marker(model_id)
            revisions[revision] = {"commit": commit, "size_bytes": size_bytes, "files": files, "last_used": time.time()}
            self._write_marker(model_id, revisions)

    def _write_marker(self, model_id: str, revisions: dict[str, dict[str, Any]]) -> None:
        marker = self.root / repo_folder(model_id) / MARKER
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model_id": model_id, "revisions": revisions}, indent=1))
        os.replace(tmp, marker)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
