"""Does this text look like a secret? One answer for every place that must not pass one on.

Used where a value is about to be shown, stored or sent and a secret must not be: a
confirmation question masks such parts of argument values, the bot (and the graph's API)
refuses such answers to a question (they would reach the graph, its checkpoint and the
model) and leaves such message bodies out of its logs, and the audit trail masks them in the
tool arguments it records. Pure; no I/O.

Three tests, any of which suffices:
- the NAME it goes by says so (`password`, `api_key`, `token`, ...: `secret_name`);
- a well-known SHAPE (a bearer/basic header, a PEM private key, a JWT, provider key prefixes
  such as `sk-`, `ghp_`, `xoxb-`, `AKIA`, `AIza`, a URL with a password, `password=...`);
- a GENERIC key: a whitespace-free run of at least 20 characters that either says it is one
  (a part named `key`, `token`, `secret`, ... next to a random-looking part of letters and
  digits: `dev-tickets-key-7f3c9a2e51b84d06`) or is as random as base64 or base36 (mixed case,
  or letters and digits, with a high Shannon entropy per character). Hashes in plain hex,
  UUIDs, ids and slugs (`q3-2026-financials-board`, `INC-0042-2026-follow-up`), CamelCase
  names, paths and URLs do not match.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter

_NAME = re.compile(
    r"(token|passw(or)?d|passphrase|secret|authorization|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|credential|cookie|session[_-]?key|client[_-]?secret)",
    re.IGNORECASE,
)
_SHAPES = [
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),  # a JWT
    re.compile(
        r"\b(sk|rk|pk)[-_](live|test|proj|ant|or)?[-_]?[A-Za-z0-9_-]{16,}"  # OpenAI, Stripe, ...
        r"|\b(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"
        r"|\bglpat-[A-Za-z0-9_-]{16,}|\bxox[abprs]-[A-Za-z0-9-]{10,}"
        r"|\b(AKIA|ASIA)[0-9A-Z]{16}\b|\bAIza[0-9A-Za-z_-]{30,}"
    ),
    # a URL with a password (the scheme bounded: unbounded, a long run of letters took
    # quadratic time, 2 s for 30 000 characters)
    re.compile(r"[a-z][a-z0-9+.-]{0,31}://[^/\s:@]+:[^/\s@]+@"),
    re.compile(r"(?i)\b(passw(or)?d|passwd|pwd|secret|api[_-]?key|token)\s*[:=]\s*\S{4,}"),
    re.compile(r"(?i)\b(passw(or)?d|passphrase|pin code)\s+(is|was)\s+\S{4,}"),
]
_RUN = re.compile(r"[A-Za-z0-9_\-+/=.~]{20,}")
_HEX_OR_UUID = re.compile(
    r"^(?:[0-9a-fA-F]+|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$"
)


def secret_name(name: str) -> bool:
    """A field or header name under which only secrets are kept."""
    return bool(_NAME.search(name))


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


_PARTS = re.compile(r"[-_.~+/=]")
_KEY_WORDS = frozenset({"key", "apikey", "token", "secret", "pass", "pwd", "auth", "cred"})


def _randomish(part: str) -> bool:
    """A stretch of letters and digits that no one would type as a word or a name."""
    return (
        len(part) >= 8
        and any(c.isdigit() for c in part)
        and any(c.isalpha() for c in part)
        and _entropy(part) >= 2.5
    )


def _labelled_value(part: str) -> bool:
    """The value next to a `key`/`token` label: letters and digits as above, but since the label
    already says what it is, a random hex value with many repeats (`9c55659c5565493f`, entropy
    2.48) or all digits still counts. Without this, one random 16-hex key in ~600 slipped."""
    return (
        len(part) >= 8
        and any(c.isdigit() for c in part)
        and (any(c.isalpha() for c in part) or len(part) >= 12)
        and _entropy(part) >= 2.0
    )


def _kind(c: str) -> str:
    return "l" if c.islower() else "u" if c.isupper() else "d" if c.isdigit() else "s"


def _switches(text: str) -> float:
    """How often the kind of character (lower, upper, digit, other) changes: ~0.5 and more in
    random keys, ~0.25 in CamelCase names and codes."""
    return sum(_kind(a) != _kind(b) for a, b in itertools.pairwise(text)) / max(len(text) - 1, 1)


def _as_random(text: str, alphabet: int) -> bool:
    """Entropy near what `len(text)` random characters of `alphabet` symbols would have."""
    return _entropy(text) >= 0.85 * math.log2(min(len(text), alphabet))


def _generic_key(run: str) -> bool:
    """A random-looking key without a known prefix: a name-like token that says it is one
    (`dev-tickets-key-7f3c9a2e51b84d06`), or a stretch as random as base64 or base36."""
    if _HEX_OR_UUID.match(run) or "://" in run or run.count("/") > 1 or run.count(".") > 2:
        return False
    parts = [p for p in _PARTS.split(run) if p]
    if any(p.lower() in _KEY_WORDS for p in parts) and any(_labelled_value(p) for p in parts):
        return True
    if any(c.islower() for c in run) and any(c.isupper() for c in run):  # base64-like
        letters = [c for c in run if c.isalpha()]
        vowels = sum(c in "aeiouAEIOU" for c in letters) / max(len(letters), 1)
        # random base64 switches kind ~65% of the time and has ~19% vowels among its letters;
        # CamelCase names switch ~45% and have ~40% vowels
        return (
            any(not c.isalpha() for c in run)
            and (_switches(run) >= 0.55 or vowels < 0.3)
            and _switches(run) >= 0.4
            and _as_random(run, 64)
        )
    longest = max(parts, key=len, default="")
    digits = sum(c.isdigit() for c in longest)
    return (  # base36-like: one long part of letters and digits
        len(longest) >= 20
        and 0.15 * len(longest) <= digits <= 0.85 * len(longest)
        and not _HEX_OR_UUID.match(longest)
        and _switches(longest) >= 0.3
        and _as_random(longest, 36)
    )


def looks_like_secret(text: str) -> bool:
    """True when `text` contains something shaped like a key, token or password."""
    if not text:
        return False
    if any(p.search(text) for p in _SHAPES):
        return True
    return any(_generic_key(m.group(0)) for m in _RUN.finditer(text))


_ASKS_FOR_SECRET = re.compile(
    r"\b(api[ _-]?keys?|keys?|tokens?|passw(or)?ds?|passphrases?|secrets?|credentials?|pins?|otp)\b",
    re.IGNORECASE,
)


def secret_answer(answer: str, question: str = "") -> bool:
    """An answer not to pass on: it looks like a secret, or the question asked for one (a key,
    token, password...) and the answer holds a random-looking word of letters and digits."""
    if looks_like_secret(answer):
        return True
    return bool(_ASKS_FOR_SECRET.search(question)) and any(
        _randomish(w) and not _HEX_OR_UUID.match(w) for w in re.findall(r"[A-Za-z0-9_\-+/=.~]{12,}", answer)
    )


def secret_spans(text: str) -> list[tuple[int, int]]:
    """Where in `text` the secret-looking parts are: (start, end) pairs, sorted, merged."""
    found = [m.span() for p in _SHAPES for m in p.finditer(text)]
    found += [m.span() for m in _RUN.finditer(text) if _generic_key(m.group(0))]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def mask_secrets(text: str, mask: str = "[hidden: looks like a secret]") -> str:
    """`text` with each secret-looking part replaced by `mask`, the rest left as it was: a
    secret-shaped word must not hide the text around it."""
    out, last = [], 0
    for start, end in secret_spans(text):
        out += [text[last:start], mask]
        last = end
    return "".join([*out, text[last:]])
