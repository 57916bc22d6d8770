// How every Tripod process stops on SIGTERM/SIGINT: it refuses new work (its health says
// draining), gives the work in flight a grace period to end, then cancels what remains. A second
// signal cuts the grace period short. Each process names what it drains through Drainable.
#pragma once

#include <signal.h>

#include <functional>
#include <utility>

#include "absl/time/time.h"

namespace tripod {

class Drainable {
 public:
  virtual ~Drainable() = default;
  // New work is refused from here on; work accepted goes on.
  virtual void StartDraining() = 0;
  // Work accepted and not yet ended.
  virtual int InFlight() const = 0;
  // Ends what remains (cancelled), and returns once it has, or within a bounded wait.
  virtual void CancelAll() = 0;
};

// A Drainable made of three functions, for a service that has those calls under other names.
class DrainableFunctions : public Drainable {
 public:
  DrainableFunctions(std::function<void()> start, std::function<int()> in_flight,
                     std::function<void()> cancel_all)
      : start_(std::move(start)),
        in_flight_(std::move(in_flight)),
        cancel_all_(std::move(cancel_all)) {}
  void StartDraining() override { start_(); }
  int InFlight() const override { return in_flight_(); }
  void CancelAll() override { cancel_all_(); }

 private:
  std::function<void()> start_;
  std::function<int()> in_flight_;
  std::function<void()> cancel_all_;
};

// StartDraining, then waits until nothing is in flight, `grace` has passed, or a second signal of
// `signals` comes (checked every `poll`), then CancelAll. Logs each step.
void Drain(Drainable& work, absl::Duration grace, const sigset_t& signals,
           absl::Duration poll = absl::Milliseconds(20));

}  // namespace tripod
