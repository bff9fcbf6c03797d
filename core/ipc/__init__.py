"""The wire layer every process shares: message types (protocol), the msgpack codec and
packed arrays (wire), typed socket wrappers (channel), and process lifelines (lifeline).
It knows nothing of the scheduler."""
