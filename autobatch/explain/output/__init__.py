"""Presentation of explain, estimate and tune results: terminal tables and figures."""
