"""Cutting one upsert into requests that each fit in a message.

The server queues a write of any size and applies it in parts itself (it answers at once with
the write's operation), so the client no longer sizes batches by throughput: it only splits an
upsert larger than one message, or than the server's documents per request, into consecutive
requests (`Lathe.upsert`), cut by the bytes each document takes in the message.
"""

from __future__ import annotations

from typing import Sequence


def batch_end(sizes: Sequence[int], start: int, max_bytes: int, max_documents: int) -> int:
    """The end of the batch starting at document `start`: documents while their sizes add up to
    at most `max_bytes` (always at least one, however large), and at most `max_documents`."""
    end, taken = start, 0
    while end < len(sizes) and end - start < max_documents:
        if end > start and taken + sizes[end] > max_bytes:
            break
        taken += sizes[end]
        end += 1
    return end
