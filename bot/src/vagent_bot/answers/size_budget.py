"""How large one message may be, so that every event the bot builds fits Matrix's limit.

Why MAX_TEXT_BYTES is 5000. The largest event the bot sends is an edit: the text twice as
`body` and twice as `formatted_body` (top-level `* ` fallback and `m.new_content`). A
homeserver refuses events over 65536 bytes, and in an encrypted room the content is sent as
base64 Megolm ciphertext (4/3 of nio's ASCII-escaped JSON, where a 2-byte character like `é`
costs 6 bytes) inside an envelope. So every content dict we build is kept under
CONTENT_MAX_BYTES of `json.dumps` output (4/3 x 45000 + ~2.5 KB of envelope and PDU < 65536).
Markdown can expand without bound (one long reference link used a thousand times), so when
the HTML does not fit, `event_content.message_content` drops formatted_body and sends plain
text; the plain body of a MAX_TEXT_BYTES part (`splitting.split_message`) always fits
(2 x 3 x 5000 + relations < 45000), and ordinary text, CJK and code keep their HTML.
"""

from __future__ import annotations

import json
from typing import Any

#: Max UTF-8 size of one message's text (see the module docstring for the arithmetic).
MAX_TEXT_BYTES = 5000
#: Max `json.dumps` size of a content dict the bot builds, so the event fits even encrypted.
CONTENT_MAX_BYTES = 45_000


def content_size(content: dict[str, Any]) -> int:
    """Bytes of the content as JSON with non-ASCII escaped: an upper bound of what is sent."""
    return len(json.dumps(content).encode())
