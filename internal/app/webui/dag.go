package webui

import (
	"sort"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/apiserver"
)

// graph is a run's steps laid out for an SVG: columns by depth (a step sits one column
// right of the deepest step it needs), rows in the workflow's order within a column.
type graph struct {
	Width, Height int
	Nodes         []node
	Edges         []edge
}

type node struct {
	Name, Status, Uses string
	X, Y               int
	Items, ItemsDone   int
	Foreach            bool
	Attempts           int
}

type edge struct {
	X1, Y1, X2, Y2 int
}

const (
	nodeW, nodeH = 168, 52
	gapX, gapY   = 56, 20
	margin       = 8
)

// layout places the steps of needs (the workflow's order) with their state in steps.
// A step the run does not know is drawn pending; a needs cycle cannot happen (the
// workflow loader refuses one), and an unknown need is ignored.
func layout(needs []apiserver.StepNeeds, steps []client.Step) graph {
	state := map[string]client.Step{}
	for _, st := range steps {
		state[st.Name] = st
	}
	index := map[string]int{}
	for i, n := range needs {
		index[n.Name] = i
	}
	depth := make([]int, len(needs))
	done := make([]bool, len(needs))
	var depthOf func(i int, guard int) int
	depthOf = func(i, guard int) int {
		if done[i] || guard > len(needs) {
			return depth[i]
		}
		d := 0
		for _, need := range needs[i].Needs {
			if j, ok := index[need]; ok {
				d = max(d, depthOf(j, guard+1)+1)
			}
		}
		depth[i], done[i] = d, true
		return d
	}
	columns := map[int][]int{}
	maxDepth := 0
	for i := range needs {
		d := depthOf(i, 0)
		columns[d] = append(columns[d], i)
		maxDepth = max(maxDepth, d)
	}
	var g graph
	pos := make([][2]int, len(needs))
	rows := 0
	for d := 0; d <= maxDepth; d++ {
		col := columns[d]
		sort.Ints(col)
		for r, i := range col {
			x, y := margin+d*(nodeW+gapX), margin+r*(nodeH+gapY)
			pos[i] = [2]int{x, y}
			st := state[needs[i].Name]
			status := st.Status
			if status == "" {
				status = "pending"
			}
			g.Nodes = append(g.Nodes, node{Name: needs[i].Name, Status: status, Uses: needs[i].Uses, X: x, Y: y,
				Items: st.Items, ItemsDone: st.ItemsDone, Foreach: needs[i].Foreach, Attempts: st.Attempts})
		}
		rows = max(rows, len(col))
	}
	for i, n := range needs {
		for _, need := range n.Needs {
			if j, ok := index[need]; ok {
				g.Edges = append(g.Edges, edge{X1: pos[j][0] + nodeW, Y1: pos[j][1] + nodeH/2, X2: pos[i][0], Y2: pos[i][1] + nodeH/2})
			}
		}
	}
	g.Width = 2*margin + (maxDepth+1)*nodeW + maxDepth*gapX
	g.Height = 2*margin + rows*nodeH + max(rows-1, 0)*gapY
	return g
}
