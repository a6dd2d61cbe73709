package pool

import "testing"

func TestTemplateNamesSayTheirProcess(t *testing.T) {
	name := TemplateName("0123456789abcdef", 4242, 987654321, "a1b2c3")
	if name != "pool-01234567-4242-987654321-a1b2c3" {
		t.Fatalf("TemplateName = %q", name)
	}
	if pid, start, ok := TemplateOwner(name); !ok || pid != 4242 || start != 987654321 {
		t.Errorf("TemplateOwner(%q) = %d %d %v", name, pid, start, ok)
	}
	for _, other := range []string{"mysnap", "pool-x", "pool-01234567-pid-1-r", "pool-01234567-1-start-r", "xpool-01234567-1-2-r", "pool-a-1-2-r-extra"} {
		if _, _, ok := TemplateOwner(other); ok {
			t.Errorf("%q taken for a template", other)
		}
	}
}
