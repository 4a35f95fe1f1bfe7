"""Knowledge: documents (RAG on Redis vector search) and entities (a FalkorDB graph), each
filtered for everyone who reads the answer (docs/knowledge.md)."""
