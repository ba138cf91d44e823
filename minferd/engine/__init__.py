"""The serving engine: sequences, their KV blocks, the scheduler, and the step loop."""
