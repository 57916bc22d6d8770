"""The scheduler's part of test_netns.py, run inside the prefill's network namespace: Reserve on
the decode worker (across the veth pair), Run on the prefill worker, Generate on the decode
worker. Prints {"tokens": [...], "bytes_sent": N} as its last line."""

import json
import sys

import grpc

import cluster as C


class Remote:

  def __init__(self, address, stub_class):
    self.address = address
    self.channel = grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)])
    self.stub = stub_class(self.channel)

  def health(self, timeout=10):
    return self.stub.Health(C.pb.HealthRequest(), metadata=C.METADATA, timeout=timeout)


def main():
  args = json.loads(sys.argv[1])
  prefill = Remote(args["prefill"], C.pgrpc.PrefillStub)
  decode = Remote(args["decode"], C.dgrpc.DecodeStub)
  tokens, last, run = C.disaggregated(prefill, decode, args["prompt"],
                                      max_tokens=args["max_tokens"])
  print(json.dumps({"tokens": tokens, "bytes_sent": run.bytes_sent,
                    "finish": int(last.finish)}))


if __name__ == "__main__":
  main()
