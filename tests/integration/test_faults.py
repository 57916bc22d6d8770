"""Faults between real worker processes on loopback. Each must leave the decode worker with every
KV block free (and no reservation, no running sequence) and still serving the next request:

  * crafted chunks pushed straight to Decode.PushKv: a corrupted payload, a missing chunk, a
    chunk past the reservation, a chunk of the wrong element type, a stream that stops without
    its end message;
  * a lease that expires before the KV comes (a late chunk is refused);
  * the prefill process killed (SIGKILL) in the middle of a transfer;
  * a Cancel during decode, and a client that hangs up during Generate;
  * KV links: a peer without the link's key turned away, and link payloads with a flipped byte,
    a replayed or another key's MAC, or too many bytes for their ranges or for any chunk refused
    before a byte lands.
"""

import hashlib
import hmac
import re
import socket
import struct
import threading
import time

import grpc
import pytest
import xxhash

import cluster as C

LEASE_MS = 1500


@pytest.fixture(scope="module")
def workers():
  with C.Cluster() as cl:
    prefill = cl.prefill(threads=1, chunk=64)
    decode = cl.decode(threads=1, kv_budget_mb=64, lease_ms=LEASE_MS)
    yield prefill, decode


@pytest.fixture(scope="module")
def prompt():
  return C.corpus_prompt(48, offset=11)


def layout(decode):
  h = decode.health()
  return h.model.n_layers, h.model.n_kv_heads, h.model.head_dim, h.kv_dtype


ROW_BYTES = {C.pb.KV_DTYPE_F32: 4, C.pb.KV_DTYPE_F16: 2, C.pb.KV_DTYPE_BF16: 2}


def chunk(decode, transfer_id, seq, layer, slot_begin, slot_end, dtype=None, corrupt=False):
  n_layers, heads, head_dim, kv_dtype = layout(decode)
  dtype = dtype or kv_dtype
  size = 2 * heads * (slot_end - slot_begin) * head_dim * ROW_BYTES[dtype]
  payload = bytes((i * 7 + seq) & 0x3f for i in range(size))  # small finite f16/bf16/f32 values
  digest = xxhash.xxh3_64_intdigest(payload)
  if corrupt:
    payload = payload[:10] + bytes([payload[10] ^ 1]) + payload[11:]
  return C.kpb.KvChunk(transfer_id=transfer_id, seq=seq, layer_begin=layer, layer_end=layer + 1,
                       slot_begin=slot_begin, slot_end=slot_end, dtype=dtype, xxh3=digest,
                       payload=payload)


def reserve(decode, n_prompt, **kw):
  return decode.stub.Reserve(C.dpb.ReserveRequest(prompt_tokens=n_prompt, **kw),
                             metadata=C.METADATA, timeout=30)


def push(decode, chunks):
  return decode.stub.PushKv(iter(chunks), metadata=C.METADATA, timeout=60)


def expect_push_refused(decode, chunks, code, pattern):
  with pytest.raises(grpc.RpcError) as e:
    push(decode, chunks)
  assert e.value.code() == code, e.value.details()
  assert re.search(pattern, e.value.details()), e.value.details()


def still_serving(prefill, decode, prompt, request_id):
  """Blocks all free, then a whole request through both workers works."""
  C.wait_until(lambda: C.all_blocks_free(decode), 15, "every decode block free")
  tokens, last, _ = C.disaggregated(prefill, decode, prompt, max_tokens=4, request_id=request_id)
  assert len(tokens) >= 1 and last.finish in (C.dpb.FINISH_STOP, C.dpb.FINISH_LENGTH)
  C.wait_until(lambda: C.all_blocks_free(decode), 15, "every decode block free afterwards")


def test_corrupted_chunk(workers, prompt):
  prefill, decode = workers
  res = reserve(decode, 33)
  assert decode.health().reservations == 1
  expect_push_refused(decode, [chunk(decode, res.transfer_id, 0, 0, 0, 32, corrupt=True)],
                      grpc.StatusCode.DATA_LOSS, "checksum")
  still_serving(prefill, decode, prompt, 1)


def test_missing_chunk(workers, prompt):
  prefill, decode = workers
  res = reserve(decode, 33)
  t = res.transfer_id
  expect_push_refused(decode, [chunk(decode, t, 0, 0, 0, 32), chunk(decode, t, 2, 1, 0, 32)],
                      grpc.StatusCode.INVALID_ARGUMENT, "gap")
  still_serving(prefill, decode, prompt, 2)


def test_chunk_past_reservation(workers, prompt):
  prefill, decode = workers
  res = reserve(decode, 33)
  expect_push_refused(decode, [chunk(decode, res.transfer_id, 0, 0, 16, 40)],
                      grpc.StatusCode.OUT_OF_RANGE, "reservation")
  still_serving(prefill, decode, prompt, 3)


def test_chunk_of_another_type_than_announced(workers, prompt):
  prefill, decode = workers
  res = reserve(decode, 33, kv_dtype=C.pb.KV_DTYPE_F16)
  expect_push_refused(decode, [chunk(decode, res.transfer_id, 0, 0, 0, 32,
                                     dtype=C.pb.KV_DTYPE_F32)],
                      grpc.StatusCode.INVALID_ARGUMENT, "type")
  still_serving(prefill, decode, prompt, 4)


def test_stream_without_end_message(workers, prompt):
  prefill, decode = workers
  res = reserve(decode, 33)
  with pytest.raises(grpc.RpcError):
    push(decode, [chunk(decode, res.transfer_id, 0, 0, 0, 32)])
  still_serving(prefill, decode, prompt, 5)


def test_lease_expires(workers, prompt):
  prefill, decode = workers
  res = reserve(decode, 33)
  assert decode.health().free_kv_blocks < decode.health().total_kv_blocks
  # The reaper frees the blocks once the lease is over, with no chunk ever sent...
  C.wait_until(lambda: C.all_blocks_free(decode), LEASE_MS / 1000 + 10, "lease expiry")
  # ...and a late chunk is refused, saying why.
  with pytest.raises(grpc.RpcError) as e:
    push(decode, [chunk(decode, res.transfer_id, 0, 0, 0, 32)])
  assert re.search("lease|expired", e.value.details()), e.value.details()
  still_serving(prefill, decode, prompt, 6)


DECODE_KV_BYTES = 'tripod:kv_transfer_bytes_total{role="decode"}'


def metric(worker, name):
  _, body = worker.http_get("/metrics")
  m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
  return float(m.group(1)) if m else 0.0


def test_prefill_killed_mid_transfer(prompt):
  with C.Cluster() as cl:
    # Small chunks and fp32: a 2000-token prefill takes seconds, its KV leaves chunk by chunk.
    victim = cl.prefill(threads=1, chunk=32, precision="fp32", name="victim")
    decode = cl.decode(threads=1, kv_budget_mb=128)
    long_prompt = C.corpus_prompt(2000)
    before = metric(decode, DECODE_KV_BYTES)
    res = reserve(decode, len(long_prompt), plan_key=victim.health().plan_key)
    errors = []

    def run():
      try:
        victim.stub.Run(C.ppb.PrefillRequest(request_id=9, prompt=long_prompt,
                                             decode_address=decode.address,
                                             transfer_id=res.transfer_id),
                        metadata=C.METADATA, timeout=120)
      except grpc.RpcError as e:
        errors.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    C.wait_until(lambda: metric(decode, DECODE_KV_BYTES) > before, 60,
                 "the first KV bytes reaching the decode worker")
    victim.signal(C.signal.SIGKILL)
    victim.wait(timeout=30)
    th.join(timeout=30)
    assert not th.is_alive() and errors, "Run should have failed with its worker killed"
    # The broken stream aborts the transfer: blocks freed well before the 30 s lease.
    C.wait_until(lambda: C.all_blocks_free(decode), 10, "blocks freed after the prefill died")
    with pytest.raises(grpc.RpcError):
      C.generate(decode, long_prompt, transfer_id=res.transfer_id, max_tokens=2, timeout=30)
    fresh = cl.prefill(threads=1, chunk=256)
    still_serving(fresh, decode, prompt, 7)


def test_cancel_during_decode(workers, prompt):
  prefill, decode = workers
  h = prefill.health()
  res = reserve(decode, len(prompt), plan_key=h.plan_key)
  prefill.stub.Run(C.ppb.PrefillRequest(request_id=10, prompt=prompt,
                                        decode_address=decode.address,
                                        transfer_id=res.transfer_id),
                   metadata=C.METADATA, timeout=60)
  req = C.dpb.GenerateRequest(request_id=10, prompt=prompt, transfer_id=res.transfer_id,
                              sampling=C.sampling(), max_tokens=100000, ignore_eos=True)
  events = []
  for ev in decode.stub.Generate(req, metadata=C.METADATA, timeout=120):
    events.append(ev)
    if len(events) == 3:
      r = decode.stub.Cancel(C.pb.CancelRequest(request_id=10), metadata=C.METADATA, timeout=10)
      assert r.found
  assert events[-1].finish == C.dpb.FINISH_CANCELLED
  assert len(events) < 1000
  still_serving(prefill, decode, prompt, 11)


def test_client_hangs_up_during_generate(workers, prompt):
  prefill, decode = workers
  req = C.dpb.GenerateRequest(request_id=12, prompt=prompt, sampling=C.sampling(),
                              max_tokens=100000, ignore_eos=True)
  call = decode.stub.Generate(req, metadata=C.METADATA, timeout=120)
  n = 0
  for _ in call:
    n += 1
    if n == 3:
      break
  call.cancel()
  C.wait_until(lambda: decode.health().running == 0, 15, "the abandoned sequence ended")
  still_serving(prefill, decode, prompt, 13)


def test_bad_requests_get_clear_errors(workers, prompt):
  prefill, decode = workers
  with pytest.raises(grpc.RpcError) as e:
    reserve(decode, 0)
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  with pytest.raises(grpc.RpcError) as e:
    C.generate(decode, [10**9], max_tokens=2)
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  with pytest.raises(grpc.RpcError) as e:
    C.generate(decode, prompt, transfer_id=12345, max_tokens=2)
  assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
  with pytest.raises(grpc.RpcError) as e:
    prefill.stub.Run(C.ppb.PrefillRequest(request_id=1, prompt=prompt,
                                          decode_address=decode.address, transfer_id=777),
                     metadata=C.METADATA, timeout=60)
  assert "777" in e.value.details() or "transfer" in e.value.details()
  with pytest.raises(grpc.RpcError) as e:
    prefill.stub.Run(C.ppb.PrefillRequest(request_id=1, prompt=[], decode_address=decode.address,
                                          transfer_id=1), metadata=C.METADATA, timeout=60)
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  still_serving(prefill, decode, prompt, 14)


# KV links (Decode.OpenKvLink) under attack: a peer that joins a link without its key, and
# payloads whose MAC does not hold (a flipped byte, an earlier chunk's or another transfer's MAC
# replayed, another key's) or whose header names too many bytes. The decode worker keeps its KV
# where only its copies reach (the guarded backend, a GPU's stand-in) and takes TCP links; the
# "prefill worker" here is this test, speaking the link's protocol (docs/workers.md, "Trust").
JOIN_DOMAIN = b"tripod kv-link join v1"
PAYLOAD_DOMAIN = b"tripod kv-link payload v1"


@pytest.fixture(scope="module")
def link_workers():
  with C.Cluster() as cl:
    common = dict(threads=1, backend="cpu-guarded-kv")
    prefill = cl.prefill(name="prefill-link", kv_link="tcp", chunk=64, **common)
    decode = cl.decode(name="decode-link", kv_links="tcp", kv_budget_mb=64, **common)
    yield prefill, decode


class Link:
  """This test's end of a TCP KV link: opened over gRPC, joined with `key` (the reply's)."""

  def __init__(self, decode, key=None):
    self.reply = decode.stub.OpenKvLink(
        C.dpb.OpenKvLinkRequest(kind=C.dpb.KV_LINK_TCP, kv_dtype=layout(decode)[3]),
        metadata=C.METADATA, timeout=30)
    assert len(self.reply.link_key) == 32
    self.key = self.reply.link_key
    self.sock = socket.create_connection(("127.0.0.1", self.reply.tcp_port), timeout=10)
    nonce = self.recv(16)
    proof = hmac.new(key or self.key, JOIN_DOMAIN + struct.pack("<Q", self.reply.link_id) + nonce,
                     hashlib.sha256).digest()
    self.sock.sendall(struct.pack("<Q", self.reply.link_id) + proof)
    self.next_seq = 0

  def recv(self, n):
    got = b""
    while len(got) < n:
      part = self.sock.recv(n - len(got))
      if not part:
        return got
      got += part
    return got

  def closed_by_peer(self):
    return self.recv(1) == b""

  def mac(self, c, payload, key=None):
    fields = (c.transfer_id, c.seq, c.link_id, c.link_seq, c.link_bytes, c.layer_begin,
              c.layer_end, c.slot_begin, c.slot_end, c.dtype)
    message = PAYLOAD_DOMAIN + b"".join(struct.pack("<Q", f & (2**64 - 1)) for f in fields)
    return hmac.new(key or self.key, message + hashlib.sha256(payload).digest(),
                    hashlib.sha256).digest()

  def chunk(self, decode, transfer_id, seq, layer, slot_begin, slot_end, sent=None):
    """A header for the next payload on the link, signed over its payload, and the bytes put on
    the link (`sent` turns the payload into what actually goes)."""
    c = chunk(decode, transfer_id, seq, layer, slot_begin, slot_end)
    payload = c.payload
    c.ClearField("payload")
    c.ClearField("xxh3")
    c.link_id, c.link_seq, c.link_bytes = self.reply.link_id, self.next_seq, len(payload)
    self.next_seq += 1
    c.link_mac = self.mac(c, payload)
    self.sock.sendall(sent(payload) if sent else payload)
    return c, payload


def flip(payload):
  return payload[:10] + bytes([payload[10] ^ 1]) + payload[11:]


def test_a_peer_without_the_link_key_is_turned_away(link_workers, prompt):
  prefill, decode = link_workers
  stranger = Link(decode, key=b"\x42" * 32)
  assert stranger.closed_by_peer()
  C.wait_until(lambda: "did not prove the link's key" in decode.log(), 10, "the refusal logged")
  still_serving(prefill, decode, prompt, 20)


def test_altered_replayed_or_wrongly_keyed_link_payloads_are_refused(link_workers, prompt):
  prefill, decode = link_workers
  link = Link(decode)
  # A byte flipped on the way.
  altered, _ = link.chunk(decode, reserve(decode, 33).transfer_id, 0, 0, 0, 32, sent=flip)
  expect_push_refused(decode, [altered], grpc.StatusCode.DATA_LOSS, "HMAC-SHA256")
  C.wait_until(lambda: C.all_blocks_free(decode), 15, "the altered transfer's blocks free")
  first = reserve(decode, 33)
  good, payload = link.chunk(decode, first.transfer_id, 0, 0, 0, 32)
  # Chunk 1 of the same transfer: chunk 0's bytes again, with chunk 0's MAC.
  again, _ = link.chunk(decode, first.transfer_id, 1, 1, 0, 32, sent=lambda _: payload)
  again.link_mac = good.link_mac
  expect_push_refused(decode, [good, again], grpc.StatusCode.DATA_LOSS, "HMAC-SHA256")
  C.wait_until(lambda: C.all_blocks_free(decode), 15, "the first transfer's blocks free")
  # Another transfer's chunk 0 with the first transfer's bytes and MAC; then signed, for its own
  # place, under another key.
  for mac_of in (lambda c: good.link_mac, lambda c: link.mac(c, payload, key=b"\x42" * 32)):
    res = reserve(decode, 33)
    c, _ = link.chunk(decode, res.transfer_id, 0, 0, 0, 32, sent=lambda _: payload)
    c.link_mac = mac_of(c)
    expect_push_refused(decode, [c], grpc.StatusCode.DATA_LOSS, "HMAC-SHA256")
  still_serving(prefill, decode, prompt, 22)


def test_oversized_link_bytes_are_refused_before_anything_is_allocated(link_workers, prompt):
  prefill, decode = link_workers
  link = Link(decode)
  # link_bytes that its ranges do not need: refused by the reservation's checks before the
  # payload is taken; its bytes are read off and dropped, and the link goes on.
  res = reserve(decode, 33)
  c, payload = link.chunk(decode, res.transfer_id, 0, 0, 0, 32, sent=lambda p: p + b"\0" * 64)
  c.link_bytes = len(payload) + 64
  expect_push_refused(decode, [c], grpc.StatusCode.INVALID_ARGUMENT, "the link payload holds")
  C.wait_until(lambda: C.all_blocks_free(decode), 15, "its blocks free")
  res = reserve(decode, 33)
  ok, _ = link.chunk(decode, res.transfer_id, 0, 0, 0, 32)
  huge = C.kpb.KvChunk()
  huge.CopyFrom(ok)
  huge.seq, huge.layer_begin, huge.layer_end = 1, 1, 2
  huge.link_seq, huge.link_bytes = link.next_seq, 1 << 40
  expect_push_refused(decode, [ok, huge], grpc.StatusCode.INVALID_ARGUMENT,
                      "more than any chunk carries")
  still_serving(prefill, decode, prompt, 23)
