// The main of every Tripod process binary (tripod-prefill, tripod-decode, tripod-draft,
// tripod-scheduler): linked into each, it runs the binary's kThisProcess and ServeThisProcess.
#include "common/rpc/worker_process.h"

int main(int argc, char** argv) {
  return tripod::RunProcess(tripod::kThisProcess, argc, argv, tripod::ServeThisProcess);
}
