// Package webui is flow's web UI: server-rendered pages (html/template) of runs, a run's
// graph and epochs, workflows, cron, the dead-letter queue and the cluster, served by
// flowd at /ui/ on its --http address from files embedded in the binary. A run's page is
// live: it holds a server-sent event stream that the server feeds from the log as it
// applies it (one wait on the node's applied sequence for every browser, no polling).
// Actions are POSTs with a per-session CSRF token from a page of the UI's own names; with
// users (flowd --auth) it asks for them (at one cost per attempt, with lockouts and at most
// two password checks at once) and shows each only the actions of its role. It answers
// only its own names (loopback, the --http host, --ui-host): any other Host, such as a DNS
// rebinding's, gets 421. docs/ui.md.
package webui
