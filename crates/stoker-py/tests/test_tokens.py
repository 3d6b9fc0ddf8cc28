"""stoker.TokenLoader over Megatron indexed datasets written by Megatron-LM's own writer (in
.venv-peers, run as a subprocess): packed rows equal the documents joined, boundaries agree,
global batches are the same at world sizes 1 to 4, and a killed process resumes at another
world size with the next global batch."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch

import stoker
import writers

ROOT = Path(__file__).resolve().parents[3]
EOS = 50256


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens") / "megatron"
    res = writers.run("write_tokens.py", "megatron", str(out))
    assert res.returncode == 0, f"write_tokens.py failed (run integration/setup.sh): {res.stderr[-2000:]}"
    docs = [numpy.frombuffer(bytes.fromhex(s["fields"][0][1]), dtype="<u2").astype(numpy.int64)
            for s in json.loads(res.stdout)]
    return out, docs


def rows(loader):
    return [b["input_ids"] for b in loader]


def test_rows_are_the_documents_joined_with_exact_boundaries(corpus):
    path, docs = corpus
    stream = numpy.concatenate([numpy.append(d, EOS) for d in docs])
    doc_of = numpy.concatenate([numpy.full(len(d) + 1, i) for i, d in enumerate(docs)])
    loader = stoker.TokenLoader(str(path), seq_len=64, global_batch=4, labels=True, eos=EOS, mask_boundaries=True)
    n = 0
    for b in loader:
        ids, pos, mask, cu = b["input_ids"], b["position_ids"], b["loss_mask"], b["cu_seqlens"]
        assert ids.dtype == torch.int32 and ids.shape == (4, 65) and mask.dtype == torch.bool
        for r in range(4):
            s = n * 4 + r
            assert ids[r].tolist() == stream[s * 64:s * 64 + 65].tolist()
            starts = [0] + [i for i in range(1, 65) if doc_of[s * 64 + i] != doc_of[s * 64 + i - 1]]
            assert (pos[r] == 0).nonzero().flatten().tolist() == starts
            assert mask[r].tolist() == [i == 0 or i not in starts for i in range(65)]
        # cu_seqlens: every segment start in the flattened batch, then its length.
        flat_starts = (pos.flatten() == 0).nonzero().flatten().tolist()
        assert cu.dtype == torch.int32 and cu.tolist() == flat_starts + [4 * 65]
        assert b["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
        n += 1
    assert n == len(loader) == ((len(stream) - 65) // 64 + 1) // 4


def test_numpy_output_is_the_torch_batches_with_the_same_types(corpus):
    path, _ = corpus
    make = lambda output: stoker.TokenLoader(str(path), seq_len=48, global_batch=3, labels=True, shuffle=True,
                                             eos=EOS, int64=True, mask_boundaries=True, output=output)
    torch_batches, numpy_batches = list(make("torch")), list(make("numpy"))
    assert len(numpy_batches) == len(torch_batches) > 3
    types = {"input_ids": numpy.int64, "position_ids": numpy.int32, "loss_mask": numpy.bool_,
             "cu_seqlens": numpy.int32}
    for t, n in zip(torch_batches, numpy_batches):
        assert set(n) == set(t) == set(types) | {"max_seqlen"}
        for name, dtype in types.items():
            assert isinstance(n[name], numpy.ndarray) and n[name].dtype == dtype, name
            assert n[name].tolist() == t[name].tolist(), name
        assert n["max_seqlen"] == t["max_seqlen"] == int(numpy.diff(n["cu_seqlens"]).max())


def test_uint16_ids_are_the_int32_ids_at_half_the_bytes(corpus):
    path, _ = corpus
    kw = dict(seq_len=48, global_batch=3, labels=True, shuffle=True, seed=2, eos=EOS, pad_tail=True)
    wide = list(stoker.TokenLoader(str(path), **kw))
    for dtype in ("uint16", torch.uint16, numpy.uint16):
        narrow = list(stoker.TokenLoader(str(path), ids_dtype=dtype, **kw))
        assert len(narrow) == len(wide) > 3
        for n, w in zip(narrow, wide):
            assert n["input_ids"].dtype == torch.uint16, dtype
            assert torch.equal(n["input_ids"].long(), w["input_ids"].long())
            assert torch.equal(n["position_ids"], w["position_ids"])
    first = next(iter(stoker.TokenLoader(str(path), ids_dtype="uint16", output="numpy", **kw)))
    assert first["input_ids"].dtype == numpy.uint16
    assert first["input_ids"].tolist() == wide[0]["input_ids"].tolist()
    assert next(iter(stoker.TokenLoader(str(path), ids_dtype="int64", **kw)))["input_ids"].dtype == torch.int64
    with pytest.raises(stoker.InvalidInputError, match="uint16.*int32"):
        stoker.TokenLoader(str(path), ids_dtype="uint16", pad_id=-100, **kw)
    with pytest.raises(stoker.InvalidInputError, match="disagree"):
        stoker.TokenLoader(str(path), ids_dtype="uint16", int64=True, **kw)
    with pytest.raises(stoker.InvalidInputError, match="float16.*uint16"):
        stoker.TokenLoader(str(path), ids_dtype=numpy.float16, **kw)
    with pytest.raises(stoker.InvalidInputError, match="ids_dtype"):
        stoker.TokenLoader(str(path), ids_dtype=object(), **kw)


def test_columns_left_out_are_not_in_the_batch_and_the_ids_are_unchanged(corpus):
    path, _ = corpus
    kw = dict(seq_len=64, global_batch=4, labels=True, eos=EOS, shuffle=True, seed=3)
    full = list(stoker.TokenLoader(str(path), **kw))
    lean = list(stoker.TokenLoader(str(path), columns=("input_ids",), **kw))
    assert len(lean) == len(full) > 0
    for a, b in zip(lean, full):
        assert list(a) == ["input_ids"]
        assert torch.equal(a["input_ids"], b["input_ids"])
    varlen = next(iter(stoker.TokenLoader(str(path), columns=["input_ids", "cu_seqlens"], output="numpy", **kw)))
    assert sorted(varlen) == ["cu_seqlens", "input_ids", "max_seqlen"]
    with pytest.raises(stoker.InvalidInputError, match="input_ids"):
        stoker.TokenLoader(str(path), columns=("position_ids",), **kw)
    with pytest.raises(stoker.InvalidInputError, match="loss_mask"):
        stoker.TokenLoader(str(path), columns=("input_ids",), mask_boundaries=True, **kw)


def test_global_batches_are_the_same_at_world_sizes_1_to_4(corpus):
    path, _ = corpus
    make = lambda r, w: stoker.TokenLoader(str(path), seq_len=32, global_batch=12, shuffle=True, seed=5, eos=EOS,
                                           rank=r, world_size=w)
    one = rows(make(0, 1))
    assert len(one) > 5
    for w in (2, 3, 4):
        per_rank = [rows(make(r, w)) for r in range(w)]
        for k, batch in enumerate(one):
            assert torch.equal(torch.cat([p[k] for p in per_rank]), batch), (w, k)


KILLED = """
import json, os, signal, sys
import stoker
loader = stoker.TokenLoader(sys.argv[1], seq_len=32, global_batch=12, shuffle=True, seed=5, eos=50256,
                            rank=0, world_size=2)
loader.set_epoch(1)
for k, b in enumerate(loader):
    if k == 3:
        break
with open(sys.argv[2], "w") as f:
    json.dump(loader.state_dict(), f)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_run_resumes_at_another_world_size_with_the_next_global_batch(corpus, tmp_path):
    path, _ = corpus
    state_file = tmp_path / "state.json"
    res = subprocess.run([sys.executable, "-c", KILLED, str(path), str(state_file)], capture_output=True, text=True, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr
    state = json.loads(state_file.read_text())
    assert (state["epoch"], state["batch"]) == (1, 4)
    whole = stoker.TokenLoader(str(path), seq_len=32, global_batch=12, shuffle=True, seed=5, eos=EOS)
    whole.set_epoch(1)
    want = rows(whole)
    resumed = []
    for r in range(3):
        loader = stoker.TokenLoader(str(path), seq_len=32, global_batch=12, shuffle=True, seed=5, eos=EOS,
                                    rank=r, world_size=3)
        loader.load_state_dict(state)
        resumed.append(rows(loader))
    assert len(resumed[0]) == len(want) - 4
    for k, batch in enumerate(want[4:]):
        assert torch.equal(torch.cat([p[k] for p in resumed]), batch), k


def test_bad_input_is_a_clear_error(corpus, tmp_path):
    path, _ = corpus
    with pytest.raises(stoker.InvalidInputError, match="multiple of the world size 2"):
        stoker.TokenLoader(str(path), seq_len=32, global_batch=3, rank=0, world_size=2)
    (tmp_path / "a.txt").write_text("not tokens")
    with pytest.raises(stoker.InvalidInputError, match="holds no token documents"):
        stoker.TokenLoader(str(tmp_path), seq_len=32, global_batch=2)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.bin").write_bytes(b"\0" * 10)
    (bad / "x.idx").write_bytes((path / "part-00.idx").read_bytes())
    with pytest.raises(stoker.StokerError, match=r"x\.idx.*past the end of the \.bin"):
        stoker.TokenLoader(str(bad), seq_len=32, global_batch=2)
    loader = stoker.TokenLoader(str(path), seq_len=32, global_batch=2)
    with pytest.raises(stoker.InvalidInputError, match="seq_len"):
        loader.load_state_dict({"epoch": 0, "batch": 1, "documents": 105, "seq_len": 64, "global_batch": 2})
    # A mix's state (naming its sources) is not taken by a loader of one corpus.
    with pytest.raises(stoker.InvalidInputError, match="reads no mix"):
        loader.load_state_dict({**loader.state_dict(), "sources": ["x", "y"]})
    loader.load_state_dict(loader.state_dict())


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    out = tmp_path_factory.mktemp("text") / "jsonl"
    res = writers.run("write_text.py", "jsonl", str(out))
    assert res.returncode == 0, f"write_text.py failed (run integration/setup.sh): {res.stderr[-2000:]}"
    return out, json.loads((out / "tokens.json").read_text())


def test_text_is_tokenized_in_rust_once_and_packed_like_the_wheels_ids(text, tmp_path, monkeypatch):
    path, ids = text
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    tok = str(path / "tokenizer.json")
    loader = stoker.TokenLoader(str(path), seq_len=128, global_batch=4, labels=True, tokenizer=tok,
                                eos="<|endoftext|>")
    eos = 0  # "<|endoftext|>" was the first special token the tokenizer was trained with
    stream = [t for doc in ids for t in doc + [eos]]
    got = torch.cat(rows(loader)).tolist()
    assert len(got) == len(loader) * 4
    for s, row in enumerate(got):
        assert row == stream[s * 128:s * 128 + 129], s
    # One tokenizing pass, kept: another loader (rank 1 of 2, another process) reuses it.
    assert len([p for p in (tmp_path / "cache" / "tokens").iterdir() if p.is_dir()]) == 1
    code = ("import stoker, sys; l = stoker.TokenLoader(sys.argv[1], seq_len=128, global_batch=4, labels=True, "
            "tokenizer=sys.argv[2], eos='<|endoftext|>', rank=1, world_size=2); "
            "print([r.tolist() for b in l for r in b['input_ids']])")
    res = subprocess.run([sys.executable, "-c", code, str(path), tok], capture_output=True, text=True,
                         env={**os.environ, "STOKER_CACHE_DIR": str(tmp_path / "cache")}, timeout=300)
    assert res.returncode == 0, res.stderr
    rank1 = json.loads(res.stdout)
    assert rank1 == [got[k * 4 + r] for k in range(len(got) // 4) for r in (2, 3)]
    with pytest.raises(stoker.InvalidInputError, match="not a token of the tokenizer"):
        stoker.TokenLoader(str(path), seq_len=128, global_batch=4, tokenizer=tok, eos="<|nope|>")
    # Ids the model's embedding cannot take fail here, not in the training step; a seq_len past
    # any batch is an InvalidInputError, not a panic.
    with pytest.raises(stoker.InvalidInputError, match="0 or more"):
        stoker.TokenLoader(str(path), seq_len=128, global_batch=4, tokenizer=tok, eos=-5)
    with pytest.raises(stoker.InvalidInputError, match="no token of the tokenizer"):
        stoker.TokenLoader(str(path), seq_len=128, global_batch=4, tokenizer=tok, bos=99999999)
    with pytest.raises(stoker.InvalidInputError, match="2\\^31"):
        stoker.TokenLoader(str(path), seq_len=2**64 - 1, global_batch=4, labels=True, tokenizer=tok)
    with pytest.raises(stoker.InvalidInputError, match="not a tokenizer.json"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        stoker.TokenLoader(str(path), seq_len=128, global_batch=4, tokenizer=str(bad))
    # A device in the tokenizer's place is refused unread; a named pipe no one writes to (whose
    # open once waited for ever) reads as empty, which is no tokenizer.
    with pytest.raises(stoker.InvalidInputError, match="not a regular file"):
        stoker.TokenLoader(str(path), seq_len=128, global_batch=4, tokenizer="/dev/zero")
    fifo = tmp_path / "tok.fifo"
    os.mkfifo(fifo)
    with pytest.raises(stoker.InvalidInputError, match="tok.fifo"):
        stoker.TokenLoader(str(path), seq_len=128, global_batch=4, tokenizer=str(fifo))


@pytest.mark.parametrize("kind", ["mds", "litdata"])
def test_mds_ndarray_columns_and_litdata_token_chunks_pack_like_any_corpus(kind, tmp_path, monkeypatch):
    """MDS (an ndarray column of ids, copied once into the tokens cache) and LitData token
    chunks (read in place): rows are the documents joined."""
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / kind
    res = writers.run("write_tokens.py", kind, str(out))
    assert res.returncode == 0, f"write_tokens.py failed (run integration/setup.sh): {res.stderr[-2000:]}"
    dtype = "<u2" if kind == "mds" else "<i4"
    docs = [numpy.frombuffer(bytes.fromhex(s["fields"][0][1]), dtype=dtype).astype(numpy.int64)
            for s in json.loads(res.stdout)]
    stream = numpy.concatenate(docs)
    field = "tokens" if kind == "mds" else None
    loader = stoker.TokenLoader(str(out), seq_len=64, global_batch=2, field=field)
    got = torch.cat(rows(loader))
    assert len(got) == len(stream) // 64 // 2 * 2
    for k, row in enumerate(got.tolist()):
        assert row == stream[k * 64:(k + 1) * 64].tolist(), k


def test_bad_documents_fail_the_pass_or_are_packed_empty_with_skip_errors(text, tmp_path, monkeypatch, capfd):
    path, ids = text
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.jsonl").write_bytes(b'{"text": "hello"}\nnot json\n{"text": "world"}\n')
    tok = str(path / "tokenizer.json")
    with pytest.raises(stoker.CorruptDataError, match=r"a\.jsonl.*a/000000001.*not a JSON object"):
        stoker.TokenLoader(str(bad), seq_len=4, global_batch=1, tokenizer=tok)
    loader = stoker.TokenLoader(str(bad), seq_len=1, global_batch=1, tokenizer=tok, skip_errors=True)
    assert "1 of 3 documents" in capfd.readouterr().err
    good = tmp_path / "good"
    good.mkdir()
    (good / "a.jsonl").write_bytes(b'{"text": "hello"}\n{"text": "world"}\n')
    clean = stoker.TokenLoader(str(good), seq_len=1, global_batch=1, tokenizer=tok)
    # The bad line is an empty document: the stream is the good ones'.
    assert [b["input_ids"].tolist() for b in loader] == [b["input_ids"].tolist() for b in clean]
    assert loader.tokens() == clean.tokens() > 0


def test_the_tokens_decode_gives_the_plain_loader_one_document_per_row(text):
    """stoker.Tokens in stoker.Loader: each row is
    its document's wheel ids and EOS, truncated or padded, with its length beside."""
    path, ids = text
    spec = stoker.Tokens(path / "tokenizer.json", seq_len=32, eos="<|endoftext|>", pad_id=-1)
    eos = 0

    def want(i):
        doc = ids[i][:31] + [eos]
        return doc + [-1] * (32 - len(doc)), len(doc)

    loader = stoker.Loader(str(path), batch_size=8, shuffle=True, seed=1, decode={"text": spec})
    seen = []
    for b in loader:
        assert b["text"].dtype == torch.int32 and b["text"].shape[1] == 32 and b["text_len"].dtype == torch.int32
        for r, i in enumerate(b["__index__"]):
            assert (b["text"][r].tolist(), int(b["text_len"][r])) == want(i), i
            seen.append(i)
    assert sorted(seen) == list(range(len(ids)))
    mask = torch.arange(32) < b["text_len"][:, None]
    assert bool((b["text"][mask] >= 0).all()) and bool((b["text"][~mask] == -1).all())
    with pytest.raises(stoker.DecodeError, match="truncate"):
        next(iter(stoker.Loader(str(path), batch_size=8, decode={"text": stoker.Tokens(
            path / "tokenizer.json", seq_len=4, truncate=False)})))
    with pytest.raises(stoker.InvalidInputError, match="not a token"):
        stoker.Loader(str(path), batch_size=8, decode={"text": stoker.Tokens(path / "tokenizer.json", 8, eos="<|x|>")})


def test_a_mix_weighted_by_tokens_keeps_its_shares_and_takes_new_weights_at_a_resume(tmp_path):
    roots = {}
    for kind in ("megatron", "megatron-i32"):
        out = tmp_path / kind
        res = writers.run("write_tokens.py", kind, str(out))
        assert res.returncode == 0, res.stderr[-2000:]
        roots[kind] = str(out)
    mixed = stoker.mix({roots["megatron"]: 0.7, roots["megatron-i32"]: 0.3}, weight_by="tokens")
    with pytest.raises(stoker.InvalidInputError, match="weighted by tokens"):
        stoker.Loader(mixed, batch_size=4)
    loader = stoker.TokenLoader(mixed, seq_len=64, global_batch=4, shuffle=True, seed=2)
    n = sum(1 for _ in loader)
    per = loader.stats()["source_tokens"]
    assert n > 20 and set(per) == {roots["megatron"], roots["megatron-i32"]}
    assert abs(per[roots["megatron"]] / sum(per.values()) - 0.7) < 0.01, per
    # Stop after 10 global batches, resume with 20/80.
    first = stoker.TokenLoader(mixed, seq_len=64, global_batch=4, shuffle=True, seed=2)
    for k, _ in enumerate(first):
        if k == 9:
            break
    state = first.state_dict()
    resumed = stoker.TokenLoader(mixed, seq_len=64, global_batch=4, shuffle=True, seed=2)
    resumed.load_state_dict(state)
    resumed.set_weights([0.2, 0.8])
    it = iter(resumed)
    next(it)
    assert resumed.state_dict()["weights"] == [[0, [0.7, 0.3]], [10, [0.2, 0.8]]], "the epoch's schedule"
    rest = 1 + sum(1 for _ in it)
    per = resumed.stats()["source_tokens"]
    assert rest > 0 and abs(per[roots["megatron"]] / sum(per.values()) - 0.2) < 0.05, per
    # At the epoch's end the state is the next epoch's start, with the weights last in force.
    assert resumed.state_dict()["weights"] == [[0, [0.2, 0.8]]]


def test_a_state_taken_at_an_epochs_end_resumes_at_the_next_epoch(corpus):
    path, _ = corpus

    def make():
        return stoker.TokenLoader(str(path), seq_len=64, global_batch=4, shuffle=True, seed=2, eos=EOS, output="numpy")

    whole = make()
    whole.set_epoch(0)
    assert sum(1 for _ in whole) == len(whole) > 0
    state = whole.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 0), state
    want = [b["input_ids"].tolist() for b in (lambda l: (l.set_epoch(1), l)[1])(make())]

    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    assert [b["input_ids"].tolist() for b in resumed] == want, "epoch 1 whole, not an empty epoch 0"
    # Kept at its end (as earlier versions wrote it): read the same way.
    resumed = make()
    resumed.load_state_dict({**state, "epoch": 0, "batch": len(whole)})
    assert [b["input_ids"].tolist() for b in resumed] == want
    # Another epoch asked for is an error, not an epoch read or skipped.
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    with pytest.raises(stoker.InvalidInputError, match=r"set_epoch\(0\).*epoch 1"):
        next(iter(resumed))


def test_weights_change_between_iterations_not_while_one_is_under_way(token_mix):
    # A change while an iteration was under way was taken and did nothing to the batches that
    # followed (they were already being cut): now refused; between iterations it applies.
    mixed = token_mix(60)
    loader = stoker.TokenLoader(mixed, seq_len=16, global_batch=2, shuffle=True, seed=5, output="numpy")
    it = iter(loader)
    next(it)
    with pytest.raises(stoker.InvalidInputError, match="under way"):
        loader.set_weights([0.9, 0.1])
    rest = sum(1 for _ in it)
    assert rest > 0
    # An older iterator closed after a newer one began does not end the newer one.
    older = iter(loader)
    next(older)
    newer = iter(loader)
    next(newer)
    older.close()
    with pytest.raises(stoker.InvalidInputError, match="under way"):
        loader.set_weights([0.9, 0.1])
    newer.close()
    loader.set_weights([0.9, 0.1])  # the iteration is over
    ids = numpy.concatenate([b["input_ids"].ravel() for b in loader])
    share_a = float(numpy.mean(ids < 30000))
    assert abs(share_a - 0.9) < 0.05, share_a
    for bad in (["a", 1], 5, "0.5,0.5", {0.9, 0.1}):
        with pytest.raises(stoker.InvalidInputError, match="weights"):
            loader.set_weights(bad)
    # An argument the loader does not know, beside an open dataset: refused, not dropped.
    with pytest.raises(stoker.InvalidInputError, match="'suffle'"):
        stoker.TokenLoader(mixed, seq_len=16, global_batch=2, suffle=True)


def test_a_null_token_list_is_the_documents_damage_which_skip_errors_packs_empty(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "lists"
    d.mkdir()
    pq.write_table(pa.table({"ids": pa.array([[1, 2, 3], None, [4, 5, 6, 7, 8]], pa.list_(pa.int32()))}),
                   d / "part-0.parquet")
    with pytest.raises(stoker.CorruptDataError, match="ids"):
        list(stoker.TokenLoader(str(d), seq_len=4, global_batch=1, field="ids", output="numpy"))
    rows = [b["input_ids"][0].tolist()
            for b in stoker.TokenLoader(str(d), seq_len=4, global_batch=1, field="ids", skip_errors=True,
                                        output="numpy")]
    assert rows == [[1, 2, 3, 4], [5, 6, 7, 8]]
