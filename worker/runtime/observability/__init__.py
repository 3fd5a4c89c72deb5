"""What the runtime shows of itself: metrics, /metrics and probes, traces, structured logs."""
