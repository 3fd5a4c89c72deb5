"""Kafka authentication: TLS and SASL settings, OAUTHBEARER token providers."""
