"""Lathe as the retriever of a RAG application.

Lathe packs the best chunks for a question into the LLM's token budget, so the prompt built here
never overflows the context window, and every chunk carries its exact offsets for citations.

    python examples/rag_retriever.py --address 127.0.0.1:50051 --demo "which port does lathe use?"

--demo creates a small collection first. With langchain-core installed
(`pip install 'lathe-client[langchain]'`), the packaged `lathe_client.langchain.LatheRetriever`
plugs Lathe into any LangChain chain as a `BaseRetriever`; without it the plain `build_prompt`
path still works.
"""

from __future__ import annotations

import argparse
from lathe_client import Chunk, Document, Lathe, LatheError

PROMPT = """Answer the question using only the numbered context passages. Cite passages as [n].

{context}

Question: {question}
Answer:"""


def format_context(chunks: list[Chunk]) -> str:
    """Numbered passages with their source and exact span, for citations."""
    passages = []
    for number, chunk in enumerate(chunks, start=1):
        where = f"{chunk.doc_id} chars {chunk.char_span.start}-{chunk.char_span.end}"
        title = f" ({chunk.section_title})" if chunk.section_title else ""
        passages.append(f"[{number}] {where}{title}\n{chunk.text}")
    return "\n\n".join(passages)


def build_prompt(
    lathe: Lathe, collection: str, question: str, context_budget: int, strategy: str = "auto"
) -> tuple[str, list[Chunk]]:
    """The prompt for `question`, whose context holds at most `context_budget` tokens."""
    result = lathe.retrieve(collection, question, budget=context_budget, strategy=strategy)
    return PROMPT.format(context=format_context(result.chunks), question=question), result.chunks


try:
    # The packaged LangChain retriever (`pip install 'lathe-client[langchain]'`).
    from lathe_client.langchain import LatheRetriever
except ImportError:  # langchain-core is optional
    LatheRetriever = None  # type: ignore[assignment,misc]


DEMO_DOCUMENTS = [
    Document(
        id="install.md",
        format="markdown",
        text="# Installing Lathe\n\nLathe ships as one binary.\n\n## Ports\n\n"
        "The gRPC API listens on port 50051 and Prometheus metrics on port 9090.\n",
    ),
    Document(
        id="budget.md",
        format="markdown",
        text="# Token budgets\n\nEvery retrieve call names a token budget; Lathe packs the best "
        "chunks into it, counted with the collection's budget tokenizer.\n",
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question")
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--collection", default="rag-demo")
    parser.add_argument("--budget", type=int, default=256, help="context tokens")
    parser.add_argument("--demo", action="store_true", help="create and fill the collection first")
    parser.add_argument("--api-key")
    parser.add_argument("--root-cert", help="PEM file of the CA that signed the server certificate")
    arguments = parser.parse_args()

    with Lathe(arguments.address, api_key=arguments.api_key, root_certificates=arguments.root_cert) as lathe:
        if arguments.demo:
            try:
                lathe.create_collection(arguments.collection)
            except LatheError as error:
                if error.code_name != "ALREADY_EXISTS":
                    raise
            lathe.upsert(arguments.collection, DEMO_DOCUMENTS, wait=True)
        prompt, chunks = build_prompt(lathe, arguments.collection, arguments.question, arguments.budget)
        print(prompt)
        print(f"\n# {len(chunks)} chunks, {sum(c.token_count for c in chunks)} tokens of {arguments.budget}")
        if LatheRetriever is not None:
            retriever = LatheRetriever(
                client=lathe, collection=arguments.collection, token_budget=arguments.budget, strategy="auto"
            )
            documents = retriever.invoke(arguments.question)
            print(f"# LangChain retriever: {len(documents)} documents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
