"""Dead letters: the record a DLQ holds, the circuit breaker, poison-record bounds, `dlq replay`."""
