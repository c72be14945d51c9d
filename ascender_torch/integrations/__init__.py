"""Integrations with other libraries; each is imported only when used."""
