"""The commands' side of explain and estimate: drive a probe server with the operations' requests and
assemble the reports. No torch: every tensor operation happens in a probe process."""
