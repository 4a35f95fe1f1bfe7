"""The embedding models: the packaged offline one (real, loaded from site-packages) and how
the remote one is configured. No server needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.knowledge import local_embedder
from vagent_graph.knowledge.embeddings import (
    LOCAL_DIMENSIONS,
    LOCAL_MODEL_ID,
    EmbeddingError,
    LocalEmbedder,
    RemoteEmbedder,
    _verified,
    make_embedder,
)
from vagent_shared.settings import GraphSettings


def test_offline_vectors_are_normalised_and_batches_change_nothing() -> None:
    model = local_embedder()
    texts = ["per diem", "The daily allowance for meals on business trips is 60 EUR. " * 4, "", "INC-0042"]
    batch = model.embed_sync(texts)
    assert batch.shape == (4, LOCAL_DIMENSIONS) and batch.dtype == np.float32
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    one_by_one = np.vstack([model.embed_sync([t]) for t in texts])
    assert np.allclose(batch, one_by_one, atol=1e-5)  # sorted by length inside, same order outside
    assert model.embed_sync([]).shape == (0, LOCAL_DIMENSIONS)


def test_meaning_not_spelling() -> None:
    a, b, c = local_embedder().embed_sync(
        [
            "How much money do I get for meals when travelling?",
            "The per diem covers food on trips.",
            "Rotate your VPN password",
        ]
    )
    assert float(a @ b) > float(a @ c) + 0.2


def test_a_changed_model_file_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the model")
    with pytest.raises(EmbeddingError, match="not the pinned file"):
        _verified(fake, "0" * 64, "the embedding model")


def test_the_offline_model_is_the_default_and_loads_lazily() -> None:
    embedder = make_embedder(GraphSettings())
    assert isinstance(embedder, LocalEmbedder) and embedder.model_id == LOCAL_MODEL_ID
    assert embedder._session is None  # nothing loaded until the first embedding


def test_an_endpoint_needs_a_model_name_and_gets_only_its_own_key() -> None:
    with pytest.raises(ValueError, match="EMBEDDINGS_MODEL"):
        make_embedder(GraphSettings(EMBEDDINGS_BASE_URL="http://127.0.0.1:1/v1"))
    elsewhere = make_embedder(
        GraphSettings(EMBEDDINGS_BASE_URL="http://emb:1/v1", EMBEDDINGS_MODEL="m", OPENAI_API_KEY="sk-llm")
    )
    assert isinstance(elsewhere, RemoteEmbedder) and elsewhere.model_id == "openai-compatible:m"
    assert elsewhere._client.api_key != "sk-llm"  # the LLM's key never goes to another host
    same = make_embedder(
        GraphSettings(
            EMBEDDINGS_BASE_URL="http://llm:1/v1",
            EMBEDDINGS_MODEL="m",
            OPENAI_BASE_URL="http://llm:1/v1",
            OPENAI_API_KEY="sk-llm",
        )
    )
    assert isinstance(same, RemoteEmbedder) and same._client.api_key == "sk-llm"
    own = make_embedder(
        GraphSettings(EMBEDDINGS_BASE_URL="http://emb:1/v1", EMBEDDINGS_MODEL="m", EMBEDDINGS_API_KEY="sk-e")
    )
    assert isinstance(own, RemoteEmbedder) and own._client.api_key == "sk-e"
