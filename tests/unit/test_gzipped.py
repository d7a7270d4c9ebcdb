"""GzipSegments: pieces deflated one by one and laid end to end make one gzip member
that inflates to the pieces joined, scrape after scrape as pieces change; a piece seen
in the last scrape is not compressed again."""

from __future__ import annotations

import gzip
import random
import zlib

import pytest

from gpuwarden.metrics.gzipped import GzipSegments


def one_member(body: bytes) -> bytes:
    """The member's text, failing unless ``body`` is exactly one whole gzip member."""
    inflate = zlib.decompressobj(wbits=31)
    text = inflate.decompress(body) + inflate.flush()
    assert inflate.eof and inflate.unused_data == b""
    return text


def pieces(rng: random.Random, n: int) -> list[str]:
    words = [
        "gpuwarden_process_memory_bytes",
        '{gpu="3",user="ålice"}',
        "1.5e+09",
        "# HELP x\n",
        "# TYPE x gauge\n",
        "显存",
        "\n",
        "0.0",
    ]
    return ["".join(rng.choice(words) for _ in range(rng.randrange(0, 400))) for _ in range(n)]


def test_scrape_after_scrape_the_same_text_as_gzip_writes() -> None:
    rng = random.Random(7)
    z = GzipSegments()
    current = pieces(rng, 30)
    for _ in range(40):
        body = z.compress(current)
        text = "".join(current).encode()
        assert one_member(body) == text
        assert gzip.decompress(body) == text
        # Some pieces change, some come and go, as families and series do.
        for i in rng.sample(range(len(current)), 3):
            current[i] = pieces(rng, 1)[0]
        if rng.random() < 0.3:
            current.insert(rng.randrange(len(current) + 1), pieces(rng, 1)[0])
        if rng.random() < 0.3 and len(current) > 1:
            current.pop(rng.randrange(len(current)))


@pytest.mark.parametrize("given", [[], [""], ["", ""], ["x"], ["a", "", "a", "a"]])
def test_empty_and_repeated_pieces(given: list[str]) -> None:
    assert one_member(GzipSegments().compress(given)) == "".join(given).encode()


def test_a_piece_seen_last_scrape_is_not_compressed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    z = GzipSegments()
    text = ["# HELP a\n", "a 1\n" * 1000, "b 2\n" * 1000]
    z.compress(text)
    made: list[int] = []
    real = zlib.compressobj

    def counting(*args: int) -> zlib._Compress:
        made.append(1)
        return real(*args)

    monkeypatch.setattr(zlib, "compressobj", counting)
    changed = [text[0], "a 3\n" * 1000, text[2]]
    assert one_member(z.compress(changed)) == "".join(changed).encode()
    assert len(made) == 1  # the changed piece alone
    made.clear()
    assert one_member(z.compress(changed)) == "".join(changed).encode()
    assert made == []  # nothing changed: nothing compressed
