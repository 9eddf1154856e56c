//go:build tools

// Package tools pins Prometheus, built by scripts/prometheus-build: promtool, which unit-tests the
// chart's alerting rules (charts/load-control/tests/alerts), and the server, which scrapes the
// API and the operator on the node in each TLS mode. Nothing here is linked into load-control.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
