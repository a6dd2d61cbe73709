package cli

import "github.com/spf13/cobra"

// verbGroups sorts the verbs in airlock --help, as docker --help does.
var verbGroups = []struct {
	id, title string
	verbs     []string
}{
	{"boxes", "Box commands:", []string{"run", "create", "exec", "ls", "start", "stop", "rm", "logs", "inspect",
		"rename", "prune", "stats", "top", "cp", "volume", "port", "network", "snapshot", "checkpoint", "rollback", "fork", "pause", "unpause",
		"commit", "export"}},
	{"images", "Image commands:", []string{"pull", "images", "rmi", "import", "save", "image", "build", "login", "logout"}},
	{"code", "Code commands:", []string{"ask", "serve", "tenant", "mcp", "events"}},
	{"cluster", "Cluster commands:", []string{"node", "gateway"}},
	{"system", "System commands:", []string{"doctor", "version", "system", "bench"}},
}

// groups puts each verb of root in its group of the help; verbs no group
// names are listed under "Additional Commands".
func groups(root *cobra.Command) {
	group := map[string]string{}
	for _, g := range verbGroups {
		root.AddGroup(&cobra.Group{ID: g.id, Title: g.title})
		for _, v := range g.verbs {
			group[v] = g.id
		}
	}
	for _, c := range root.Commands() {
		if id, ok := group[c.Name()]; ok && c.GroupID == "" {
			c.GroupID = id
		}
	}
	root.SetHelpCommandGroupID("system")
	root.SetCompletionCommandGroupID("system")
}
