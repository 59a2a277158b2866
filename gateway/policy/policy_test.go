package policy

import "testing"

func TestMatch(t *testing.T) {
	cases := []struct {
		pattern, host string
		want          bool
	}{
		{"example.com", "example.com", true},
		{"Example.COM.", "example.com", true},
		{"example.com", "a.example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false}, // documented: the apex is not matched
		{"*.example.com", "badexample.com", false},
		{"*.example.com", "example.com.evil.test", false},
		{"*", "anything.test", true},
		{"*", "10.0.0.1", false}, // IP literals only match exact entries
		{"*.0.0.1", "10.0.0.1", false},
		{"10.0.0.1", "10.0.0.1", true},
		{"::ffff:10.0.0.1", "10.0.0.1", true},
		{"example.com", "10.0.0.1", false},
	}
	for _, c := range cases {
		h, ok := Normalize(c.host)
		if !ok {
			t.Fatalf("Normalize(%q) failed", c.host)
		}
		if got := Match(c.pattern, h); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.host, got, c.want)
		}
	}
}

func TestNormalize(t *testing.T) {
	cases := map[string]string{
		"Example.COM.":    "example.com",
		"a_b-c.test":      "a_b-c.test",
		"::FFFF:1.2.3.4":  "1.2.3.4",
		"":                "",
		".":               "",
		"a..b":            "",
		"a b.test":        "",
		"a/b.test":        "",
		"fe80::1%eth0":    "",
		"xn--bcher-kva.x": "xn--bcher-kva.x",
	}
	for in, want := range cases {
		got, ok := Normalize(in)
		if ok != (want != "") || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestDecide(t *testing.T) {
	pool := Pool{
		Allow:     []string{"*.example.com", "api.test", "pypi.org", "10.1.2.3"},
		Deny:      []string{"evil.example.com", "*.internal.example.com"},
		PlainHTTP: []string{"deb.example.com"},
	}
	cases := []struct {
		name  string
		box   Box
		host  string
		plain bool
		allow bool
		rule  string
	}{
		{"exact allow", Box{}, "api.test", false, true, "pool.allow:api.test"},
		{"wildcard allow", Box{}, "a.example.com", false, true, "pool.allow:*.example.com"},
		{"apex not under wildcard", Box{}, "example.com", false, false, "pool.allow:none"},
		{"not listed", Box{}, "other.test", false, false, "pool.allow:none"},
		{"deny wins over wildcard", Box{}, "evil.example.com", false, false, "pool.deny:evil.example.com"},
		{"deny wildcard wins", Box{}, "db.internal.example.com", false, false, "pool.deny:*.internal.example.com"},
		{"deny case-insensitive", Box{}, "EVIL.example.com.", false, false, "pool.deny:evil.example.com"},
		{"box narrows", Box{Allow: []string{"api.test"}}, "a.example.com", false, false, "box.allow:none"},
		{"box narrowed allow", Box{Allow: []string{"api.test"}}, "api.test", false, true, "box.allow:api.test"},
		{"box cannot widen", Box{Allow: []string{"other.test"}}, "other.test", false, false, "pool.allow:none"},
		{"box empty list allows nothing", Box{Allow: []string{}}, "api.test", false, false, "box.allow:none"},
		{"box deny", Box{Deny: []string{"api.test"}}, "api.test", false, false, "box.deny:api.test"},
		{"box allow cannot beat pool deny", Box{Allow: []string{"evil.example.com"}}, "evil.example.com", false, false, "pool.deny:evil.example.com"},
		{"plain http refused by default", Box{}, "api.test", true, false, "plainHttp:none"},
		{"plain http where listed", Box{}, "deb.example.com", true, true, "pool.allow:*.example.com,plainHttp:deb.example.com"},
		{"plain http still needs allow", Box{Allow: []string{"api.test"}}, "deb.example.com", true, false, "box.allow:none"},
		{"ip literal exact", Box{}, "10.1.2.3", false, true, "pool.allow:10.1.2.3"},
		{"invalid host", Box{}, "a b", false, false, "host:invalid"},
	}
	for _, c := range cases {
		d := Decide(pool, c.box, c.host, c.plain)
		if d.Allow != c.allow || d.Rule != c.rule {
			t.Errorf("%s: Decide(%q) = %+v, want {%v %s}", c.name, c.host, d, c.allow, c.rule)
		}
	}
}

func TestOutside(t *testing.T) {
	pool := []string{"*.example.com", "api.test"}
	got := Outside([]string{"a.example.com", "*.b.example.com", "*.example.com", "api.test", "example.com", "*.test", "*"}, pool)
	want := []string{"example.com", "*.test", "*"}
	if len(got) != len(want) {
		t.Fatalf("Outside = %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Outside = %q, want %q", got, want)
		}
	}
	if o := Outside([]string{"x.test", "*.y.test"}, []string{"*"}); len(o) != 0 {
		t.Errorf("everything is within *: %q", o)
	}
}

func TestValidPattern(t *testing.T) {
	for p, ok := range map[string]bool{"*": true, "*.a.test": true, "a.test": true, "1.2.3.4": true,
		"*.1.2.3.4": false, "a.*.test": false, "**.a": false, "": false, "a b": false} {
		if err := ValidPattern(p); (err == nil) != ok {
			t.Errorf("ValidPattern(%q) = %v, want ok=%v", p, err, ok)
		}
	}
}

// Properties over arbitrary hosts: deny wins, a box never widens its pool, plain HTTP is never
// allowed where HTTPS is not.
func FuzzDecide(f *testing.F) {
	for _, h := range []string{"a.example.com", "example.com", "evil.example.com", "x.y.internal.example.com", "1.2.3.4", "A.Example.Com.", "", "*"} {
		f.Add(h)
	}
	pool := Pool{Allow: []string{"*.example.com", "api.test", "*"}, Deny: []string{"evil.example.com", "*.internal.example.com"}, PlainHTTP: []string{"*.example.com"}}
	box := Box{Allow: []string{"a.example.com", "*.test", "other.org"}, Deny: []string{"b.example.com"}}
	f.Fuzz(func(t *testing.T, host string) {
		for _, plain := range []bool{false, true} {
			withBox := Decide(pool, box, host, plain)
			poolOnly := Decide(pool, Box{}, host, plain)
			if withBox.Allow && !poolOnly.Allow {
				t.Fatalf("%q: the box widened its pool (%s vs %s)", host, withBox.Rule, poolOnly.Rule)
			}
			if h, ok := Normalize(host); ok && poolOnly.Allow {
				for _, d := range pool.Deny {
					if Match(d, h) {
						t.Fatalf("%q allowed though it matches deny %q", host, d)
					}
				}
			}
			if plain && withBox.Allow && !Decide(pool, box, host, false).Allow {
				t.Fatalf("%q: plain HTTP allowed where HTTPS is not", host)
			}
		}
	})
}
