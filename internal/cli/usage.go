package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
)

// ExitUsage is the exit status of a usage error (a missing argument, an
// unknown flag or verb, a bad flag value), as in the Docker CLI.
const ExitUsage = 125

// usageError is a command line the verb cannot take. Main prints it with a
// pointer to the verb's help and exits with ExitUsage.
type usageError struct {
	cmd string // command path without "airlock ", e.g. "exec"
	msg string
}

func (e *usageError) Error() string { return e.msg }

// usagef returns a usage error of cmd.
func usagef(cmd *cobra.Command, format string, a ...any) error {
	return &usageError{cmd: verbPath(cmd), msg: fmt.Sprintf(format, a...)}
}

// verbPath is the command path without the program name ("image rm").
func verbPath(cmd *cobra.Command) string {
	p := cmd.CommandPath()
	if i := strings.IndexByte(p, ' '); i >= 0 {
		return p[i+1:]
	}
	return ""
}

// printUsageError reports err (a usage error) and its help pointer.
func printUsageError(w interface{ Write([]byte) (int, error) }, err error) {
	var ue *usageError
	help := "airlock --help"
	if errors.As(err, &ue) && ue.cmd != "" {
		help = "airlock " + ue.cmd + " --help"
	}
	fmt.Fprintf(w, "airlock: %v\nSee '%s'.\n", err, help)
}

// isCobraUsage tells cobra's own command-line errors (unknown verb) apart
// from failures of a verb.
func isCobraUsage(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command ") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.HasPrefix(s, "flag needs an argument") ||
		strings.HasPrefix(s, "invalid argument ")
}

// positionals returns the required and optional argument names of a Use
// line ("exec [flags] BOX COMMAND [ARG...]": BOX, COMMAND required; ARG
// optional and repeatable), skipping flags and their values.
func positionals(use string) (required []string, optional int, variadic bool) {
	f := strings.Fields(use)
	depth := 0
	skipNext := false
	for _, t := range f[min(1, len(f)):] {
		d := depth
		depth += strings.Count(t, "[") - strings.Count(t, "]")
		name := strings.Trim(t, "[]")
		if skipNext {
			skipNext = false
			continue
		}
		if strings.HasPrefix(name, "-") {
			skipNext = !strings.Contains(t, "]") && !strings.Contains(name, "=")
			continue
		}
		if name == "flags" || name == "" || name != strings.ToUpper(name) {
			continue
		}
		if strings.HasSuffix(name, "...") {
			variadic = true
			name = strings.TrimSuffix(name, "...")
		}
		if d == 0 && !strings.HasPrefix(t, "[") {
			required = append(required, name)
		} else {
			optional++
		}
	}
	return required, optional, variadic
}

// argsError words a failed argument check of cmd: the missing argument by
// name ("exec: missing COMMAND"), or the unexpected one.
func argsError(cmd *cobra.Command, args []string, err error) error {
	req, opt, variadic := positionals(cmd.Use)
	v := verbPath(cmd)
	if len(args) < len(req) {
		return usagef(cmd, "%s: missing %s (usage: airlock %s)", v, req[len(args)], cmd.UseLine()[len("airlock "):])
	}
	if !variadic && len(args) > len(req)+opt {
		return usagef(cmd, "%s: unexpected argument %q (usage: airlock %s)", v, args[len(req)+opt], cmd.UseLine()[len("airlock "):])
	}
	return usagef(cmd, "%s: %v", v, err)
}

// finishTree makes every verb of root report usage errors the same way:
// argument errors name what is missing, flag errors point to the verb's
// help, and both exit with ExitUsage.
func finishTree(root *cobra.Command) {
	root.SetFlagErrorFunc(flagError125)
	completions(root)
	groups(root)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && !c.Runnable() && c.HasSubCommands() {
			// A group (image, system): no subcommand prints its help; an
			// unknown one is a usage error.
			c.Args = func(cmd *cobra.Command, args []string) error {
				if len(args) > 0 {
					return usagef(cmd, "%s: unknown command %q", verbPath(cmd), args[0])
				}
				return nil
			}
			c.RunE = func(cmd *cobra.Command, args []string) error { return cmd.Help() }
		}
		if orig := c.Args; orig != nil {
			c.Args = func(cmd *cobra.Command, args []string) error {
				if err := orig(cmd, args); err != nil {
					var ue *usageError
					if errors.As(err, &ue) {
						return err
					}
					return argsError(cmd, args, err)
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// badValue matches pflag's message for a value its parser refused; the
// parser's own words (strconv.ParseInt: ...) are not for users.
var badValue = regexp.MustCompile(`^invalid argument (".*") for "(.*)" flag: .*$`)

// flagError125 reports a bad flag (unknown, or a value it cannot take) as
// a usage error, saying what the flag takes.
func flagError125(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if m := badValue.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("invalid value %s for %s", m[1], m[2])
	}
	return usagef(cmd, "%s%s%s", prefixOf(cmd), msg, hintOf(err))
}

func prefixOf(cmd *cobra.Command) string {
	if v := verbPath(cmd); v != "" {
		return v + ": "
	}
	return ""
}

func hintOf(err error) string {
	if h := flagHint(err.Error()); h != "" {
		return " (" + strings.TrimSuffix(h, "; ") + ")"
	}
	return ""
}
