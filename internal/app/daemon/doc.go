// Package daemon is the flowd daemon as a library: its configuration (flags, FLOWD_*
// environment and a YAML file through viper, flags winning), its validation, and its
// life (engine, HTTP health and metrics, signal-driven drain). cmd/flowd is a thin main.
package daemon
