"""What both sides of explain share: records, operation options, card profiles, levers and the search
over simulations. No torch and no I/O here (ruff's banned-api checks it, as for autobatch/core)."""
