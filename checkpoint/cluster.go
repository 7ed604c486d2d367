package checkpoint

import (
	"fmt"
)

// The cluster version (docs/checkpoint.md, "The cluster version"): the log format
// writers use. It starts at 1 (format 1, JSON, what every release before the gate
// wrote) and is raised only by the leader's cluster_version entry, once every node of
// the cluster has said that it reads the new format (engine/internal/gate). It never
// moves down: a node that applied version N writes format N, and a message of format N
// is readable only by nodes that said so.
//
//	m/cluster-version   the applied cluster version (absent: 1)
var keyClusterVersion = []byte("m/cluster-version")

// ClusterVersion is the applied cluster version: the log format this node's writers
// use.
func (s *Store) ClusterVersion() int { return int(s.clusterVersion.Load()) }

// ReadFormat is the newest log format this store reads (MaxReadFormat, unless
// StoreOptions.ReadFormat said older).
func (s *Store) ReadFormat() int { return s.reader.format }

// raiseClusterVersion judges a cluster_version entry (its term was checked): it moves
// the version up, never down or sideways. A version above what this binary reads stops
// the applier (ErrNewerFormat): the node cannot follow the log from here and must be
// upgraded, which is what the gate exists to prevent and what --hold-cluster-version
// and a forgotten node can still cause.
func (tx *applyBatch) raiseClusterVersion(e *Entry) error {
	current := max(tx.clusterVersion, tx.s.ClusterVersion())
	if e.ClusterVersion <= current {
		return fmt.Errorf("%w: the cluster version is already %d; it moves only up", ErrInvalidEntry, current)
	}
	if e.ClusterVersion > tx.s.reader.format {
		return fmt.Errorf("%w: at sequence %d the cluster version moves to %d; this flowd reads log formats up to %d", ErrNewerFormat, tx.seq, e.ClusterVersion, tx.s.reader.format)
	}
	tx.clusterVersion = e.ClusterVersion
	return nil
}
