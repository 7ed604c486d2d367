package daemon

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/steps"
)

// metrics reads the engine's counters at scrape time (a prometheus.Collector), plus a
// step duration histogram fed by the engine.
type metrics struct {
	engine       *engine.Engine
	api          *apiserver.Server // its counters of signals and decisions (nil: none yet)
	stepDuration *prometheus.HistogramVec
	descs        map[string]*prometheus.Desc
}

func newMetrics() *metrics {
	m := &metrics{
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flow_step_duration_seconds", Help: "Duration of step attempts, by kind and result.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"kind", "result"}),
		descs: map[string]*prometheus.Desc{},
	}
	for name, help := range map[string]string{
		"flow_commits_total":                "Commits decided by this node's applier, by result (accepted, fenced).",
		"flow_epoch_changes_total":          "New epochs given to runs (assigns applied).",
		"flow_stale_term_rejections_total":  "Scheduler entries rejected for a stale leader term.",
		"flow_log_rejected_total":           "Log messages this node's applier could not decode and recorded as rejected.",
		"flow_runs_retired_total":           "Runs removed from this node's state at the end of their retention.",
		"flow_leader_term":                  "Highest leader term applied.",
		"flow_is_leader":                    "1 if this node leads the scheduler.",
		"flow_lease_renewals_total":         "Lease and term renewals, by result (ok, failed).",
		"flow_leases_lost_total":            "Run leases lost (not released).",
		"flow_terms_won_total":              "Leader terms won by this node.",
		"flow_lease_degraded_seconds_total": "Time run leases spent degraded.",
		"flow_runs":                         "Runs by status, in this node's state.",
		"flow_runs_waiting":                 "Pending runs waiting for an epoch (the backlog admission holds back), in this node's state.",
		"flow_runs_assigned":                "Runs assigned an epoch and waiting for a worker to claim it.",
		"flow_runs_parked":                  "Runs with status waiting (parked), by what they wait for (signal, approval, timer, child), in this node's state.",
		"flow_runs_deadline_missed_total":   "Runs that had not succeeded by their workflow's deadline, by workflow, as this node applied the leader's marks since it started.",
		"flow_signals_total":                "Signals this node's API sent to runs.",
		"flow_approvals_total":              "Approvals and rejections this node's API wrote, by decision (approve, reject).",
		"flow_dlq_size":                     "Runs in the dead-letter queue.",
		"flow_apply_lag_messages":           "Log messages not yet applied by this node.",
		"flow_stolen_total":                 "Epochs this node stopped as lock-stolen-mid-run.",
		"flow_handed_back_total":            "Runs handed back on drain.",
		"flow_tasks_deferred_total":         "Tasks put back because another holder still had the run's lease.",
		"flow_tasks_not_here_total":         "Tasks put back because their run needs a worker label (runs_on) this node lacks.",
		"flow_runs_waiting_for_label":       "Queued runs no live node can take, by the first worker label (runs_on) none has, in this node's state.",
		"flow_rate_starts_total":            "Rate-limited step attempts this node started at their reserved moment, by rate_limit key.",
		"flow_rate_late_total":              "Rate-limited starts that woke past their moment's slack and reserved again, by key.",
		"flow_rate_conflicts_total":         "Rate reservations made again because another start's came first, by key.",
		"flow_rate_wait_seconds_total":      "Time rate-limited starts on this node waited for their moment, by key.",
		"flow_rate_waiting":                 "Rate-limited starts waiting on this node for their moment now, by key.",
		"flow_step_attempts_total":          "Step attempts started by this node's workers (retries included).",
		"flow_step_failures_total":          "Step attempts on this node that failed (an error, a timeout, a lost lease).",
		"flow_leases_acquired_total":        "Run leases this node's workers acquired.",
		"flow_nats_reconnects_total":        "Times this node's NATS connection was lost and made again.",
		"flow_part_restarts_total":          "Times a long-lived NATS interaction (log-consumer, election, lease-watcher, tasks, triggers, api) was started again after it failed or fell silent, by part.",
		"flow_part_healthy":                 "1 if the part (log-consumer, election, lease-watcher, tasks, triggers, api) has heard from NATS within its silence limit.",
		"flow_trigger_messages_total":       "Messages of workflows' triggers (on:) this node handled while it led, by workflow and outcome (started, signalled, seen, refused, retried).",
		"flow_trigger_problem":              "1 while this node's triggers cannot run as applied (a stream that cannot capture a subject, a consumer not made, the cluster version below 3); the log and readyz say why.",
		"flow_step_containment":             "1 for how this node contains exec steps' processes: pid-namespace, user-pid-namespace, subreaper or process-group (none).",
	} {
		var labels []string
		switch name {
		case "flow_commits_total", "flow_lease_renewals_total":
			labels = []string{"result"}
		case "flow_runs":
			labels = []string{"status"}
		case "flow_part_healthy", "flow_part_restarts_total":
			labels = []string{"part"}
		case "flow_runs_parked":
			labels = []string{"kind"}
		case "flow_runs_waiting_for_label":
			labels = []string{"label"}
		case "flow_rate_starts_total", "flow_rate_late_total", "flow_rate_conflicts_total", "flow_rate_wait_seconds_total", "flow_rate_waiting":
			labels = []string{"key"}
		case "flow_runs_deadline_missed_total":
			labels = []string{"workflow"}
		case "flow_approvals_total":
			labels = []string{"decision"}
		case "flow_step_containment":
			labels = []string{"mode"}
		case "flow_trigger_messages_total":
			labels = []string{"workflow", "outcome"}
		}
		m.descs[name] = prometheus.NewDesc(name, help, labels, nil)
	}
	return m
}

func (m *metrics) observeStep(kind string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.stepDuration.WithLabelValues(kind, result).Observe(d.Seconds())
}

// Describe sends the descriptors.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
}

// Collect reads the counters.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	e := m.engine
	if e == nil {
		return
	}
	m0 := e.Metrics(context.Background())
	counter := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.CounterValue, v, labels...)
	}
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.GaugeValue, v, labels...)
	}
	counter("flow_commits_total", float64(m0.CommitsAccepted), "accepted")
	counter("flow_commits_total", float64(m0.CommitsFenced), "fenced")
	counter("flow_epoch_changes_total", float64(m0.EpochChanges))
	counter("flow_stale_term_rejections_total", float64(m0.StaleTerms))
	counter("flow_log_rejected_total", float64(m0.LogRejected))
	counter("flow_runs_retired_total", float64(m0.RunsRetired))
	leader := 0.0
	if m0.Leading {
		leader = 1
	}
	gauge("flow_leader_term", float64(m0.HighestTerm))
	gauge("flow_is_leader", leader)
	counter("flow_lease_renewals_total", float64(m0.RenewalsOK), "ok")
	counter("flow_lease_renewals_total", float64(m0.RenewalsFailed), "failed")
	counter("flow_leases_lost_total", float64(m0.LeasesLost))
	counter("flow_terms_won_total", float64(m0.TermsWon))
	counter("flow_lease_degraded_seconds_total", m0.LeaseDegraded.Seconds())
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusPending, checkpoint.StatusRunning, checkpoint.StatusSucceeded,
		checkpoint.StatusFailed, checkpoint.StatusCancelled, checkpoint.StatusDeadLettered, checkpoint.StatusWaiting} {
		n := m0.Runs[st]
		gauge("flow_runs", float64(n), string(st))
		if st == checkpoint.StatusDeadLettered {
			gauge("flow_dlq_size", float64(n))
		}
	}
	gauge("flow_runs_waiting", float64(m0.Queued))
	gauge("flow_runs_assigned", float64(m0.Assigned))
	for kind, n := range m0.Parked {
		gauge("flow_runs_parked", float64(n), kind)
	}
	for wf, n := range m0.DeadlinesMissed {
		counter("flow_runs_deadline_missed_total", float64(n), wf)
	}
	var c apiserver.Counts
	if m.api != nil {
		c = m.api.Counts()
	}
	counter("flow_signals_total", float64(c.Signals))
	counter("flow_approvals_total", float64(c.Approvals), "approve")
	counter("flow_approvals_total", float64(c.Rejections), "reject")
	if m0.ApplyLag >= 0 {
		gauge("flow_apply_lag_messages", float64(m0.ApplyLag))
	}
	counter("flow_stolen_total", float64(m0.Stolen))
	counter("flow_handed_back_total", float64(m0.HandedBack))
	counter("flow_tasks_deferred_total", float64(m0.TasksDeferred))
	counter("flow_tasks_not_here_total", float64(m0.TasksNotHere))
	for label, n := range m0.WaitingForLabel {
		gauge("flow_runs_waiting_for_label", float64(n), label)
	}
	for key, r := range m0.Rates {
		counter("flow_rate_starts_total", float64(r.Starts), key)
		counter("flow_rate_late_total", float64(r.Late), key)
		counter("flow_rate_conflicts_total", float64(r.Conflicts), key)
		counter("flow_rate_wait_seconds_total", r.Waited.Seconds(), key)
		gauge("flow_rate_waiting", float64(r.Waiting), key)
	}
	counter("flow_step_attempts_total", float64(m0.StepAttempts))
	counter("flow_step_failures_total", float64(m0.StepFailures))
	counter("flow_leases_acquired_total", float64(m0.LeasesAcquired))
	counter("flow_nats_reconnects_total", float64(m0.NATSReconnects))
	// Every part running now (0 if never restarted), and every part that was restarted.
	restarts := map[string]int64{}
	for _, p := range m0.Parts {
		restarts[p.Name] = 0
	}
	for name, n := range m0.RestartsByPart {
		restarts[name] = n
	}
	for name, n := range restarts {
		counter("flow_part_restarts_total", float64(n), name)
	}
	gauge("flow_step_containment", 1, string(steps.Containment()))
	tr := e.Triggers()
	for k, n := range tr.Messages {
		counter("flow_trigger_messages_total", float64(n), k[0], k[1])
	}
	gauge("flow_trigger_problem", map[bool]float64{true: 1, false: 0}[tr.Problem != ""])
	for _, p := range m0.Parts {
		up := 0.0
		if p.Healthy {
			up = 1
		}
		gauge("flow_part_healthy", up, p.Name)
	}
}
