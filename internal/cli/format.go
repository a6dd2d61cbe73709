package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"
	"text/template"

	"github.com/spf13/cobra"
)

// listFormat is the --format and -q of a listing verb (ls, images, and
// later volume ls, snapshot ls): a table by default; "json", one JSON
// object per line (as docker ps --format json); a Go template applied to
// each row ("{{.ID}}"), "table " before it adding a header row; -q the
// first column only.
type listFormat struct {
	format string
	quiet  bool
}

// add registers --format and -q/--quiet with what -q prints.
func (f *listFormat) add(cmd *cobra.Command, quietWhat string) {
	cmd.Flags().StringVar(&f.format, "format", "", "output format: table (default), json (one object per line), or a Go template such as '{{.ID}}'")
	cmd.Flags().BoolVarP(&f.quiet, "quiet", "q", false, "only print "+quietWhat)
}

// column is one column of a listing: its header and how to render a row.
type column[T any] struct {
	header string
	value  func(T) string
}

// writeList renders rows on w in the chosen format. Rows are values of a
// struct type whose exported fields are what templates and JSON see; -q
// prints the column quietCol (default the first).
func writeList[T any](w io.Writer, f listFormat, rows []T, cols []column[T], quietCol ...int) error {
	switch {
	case f.quiet:
		q := 0
		if len(quietCol) > 0 {
			q = quietCol[0]
		}
		for _, r := range rows {
			fmt.Fprintln(w, cols[q].value(r))
		}
		return nil
	case f.format == "json":
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	case f.format == "" || f.format == "table":
		tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
		hdr := make([]string, len(cols))
		for i, c := range cols {
			hdr[i] = c.header
		}
		fmt.Fprintln(tw, strings.Join(hdr, "\t"))
		for _, r := range rows {
			vals := make([]string, len(cols))
			for i, c := range cols {
				vals[i] = c.value(r)
			}
			fmt.Fprintln(tw, strings.Join(vals, "\t"))
		}
		return tw.Flush()
	}
	text, table := strings.CutPrefix(f.format, "table ")
	tmpl, err := parseTemplate(text)
	if err != nil {
		return err
	}
	var out io.Writer = w
	var tw *tabwriter.Writer
	if table {
		tw = tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
		out = tw
		// The header: each {{.Field}} replaced by the field's name in
		// capitals, as docker does.
		hdr := fieldRef.ReplaceAllStringFunc(text, func(m string) string {
			return strings.ToUpper(fieldRef.FindStringSubmatch(m)[1])
		})
		fmt.Fprintln(out, unescapeTabs(hdr))
	}
	for _, r := range rows {
		if err := executeLine(out, tmpl, r); err != nil {
			return err
		}
	}
	if tw != nil {
		return tw.Flush()
	}
	return nil
}

// parseTemplate parses a --format template; "\t" and "\n" written as
// two characters (as in a shell's single quotes) mean tab and newline.
// The json function renders a value as JSON ({{json .State}}).
func parseTemplate(text string) (*template.Template, error) {
	t, err := template.New("format").Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"join":  strings.Join,
		"upper": strings.ToUpper,
		"lower": strings.ToLower,
	}).Parse(unescapeTabs(text))
	if err != nil {
		return nil, &usageError{msg: fmt.Sprintf("--format: %v", err)}
	}
	return t, nil
}

// fieldRef matches a plain field reference in a template ({{.ID}}).
var fieldRef = regexp.MustCompile(`\{\{\s*\.(\w+)\s*\}\}`)

// goType matches the Go type that template errors name ("in type
// cli.boxRow"), which users cannot do anything with.
var goType = regexp.MustCompile(` in type \S+`)

func unescapeTabs(s string) string {
	return strings.NewReplacer(`\t`, "\t", `\n`, "\n").Replace(s)
}

// executeLine renders one row and ends the line.
func executeLine(w io.Writer, t *template.Template, v any) error {
	var sb strings.Builder
	if err := t.Execute(&sb, v); err != nil {
		return &usageError{msg: "--format: " + goType.ReplaceAllString(err.Error(), "")}
	}
	s := sb.String()
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	_, err := io.WriteString(w, s)
	return err
}
