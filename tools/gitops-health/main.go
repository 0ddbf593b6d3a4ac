// Command gitops-health evaluates the ReloadPolicy health checks shipped in docs/gitops/ the
// way the GitOps tools do, so tests/gitops_health.rs checks what users copy against statuses the
// operator wrote:
//
//	gitops-health flux <kustomization.yaml> < objects.json
//	    Flux's healthCheckExprs, with Flux's own evaluator (github.com/fluxcd/pkg/runtime/cel).
//	gitops-health argocd <health.lua> < objects.json
//	    An Argo CD resource health script, in gopher-lua (the interpreter Argo CD embeds), with
//	    the object as the global `obj`.
//
// objects.json is a JSON array of objects; one line is printed per object: the status (and for
// Argo CD, a tab and the message).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/fluxcd/pkg/apis/kustomize"
	"github.com/fluxcd/pkg/runtime/cel"
	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gitops-health flux|argocd <file> < objects.json")
		os.Exit(2)
	}
	text, err := os.ReadFile(os.Args[2])
	check(err)
	var objects []map[string]any
	check(json.NewDecoder(os.Stdin).Decode(&objects))
	switch os.Args[1] {
	case "flux":
		flux(text, objects)
	case "argocd":
		argocd(string(text), objects)
	default:
		check(fmt.Errorf("unknown tool %q", os.Args[1]))
	}
}

func flux(text []byte, objects []map[string]any) {
	var k struct {
		Spec struct {
			HealthCheckExprs []kustomize.CustomHealthCheck `json:"healthCheckExprs"`
		} `json:"spec"`
	}
	check(yaml.Unmarshal(text, &k))
	if len(k.Spec.HealthCheckExprs) != 1 {
		check(fmt.Errorf("expected one healthCheckExprs entry, found %d", len(k.Spec.HealthCheckExprs)))
	}
	evaluator, err := cel.NewStatusEvaluator(&k.Spec.HealthCheckExprs[0].HealthCheckExpressions)
	check(err)
	for _, obj := range objects {
		result, err := evaluator.Evaluate(context.Background(), &unstructured.Unstructured{Object: obj})
		check(err)
		fmt.Println(result.Status)
	}
}

func argocd(script string, objects []map[string]any) {
	for _, obj := range objects {
		l := lua.NewState(lua.Options{SkipOpenLibs: false})
		l.SetGlobal("obj", toLua(l, obj))
		check(l.DoString(script))
		hs, ok := l.Get(-1).(*lua.LTable)
		if !ok {
			check(fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type()))
		}
		fmt.Printf("%s\t%s\n", lua.LVAsString(hs.RawGetString("status")), lua.LVAsString(hs.RawGetString("message")))
		l.Close()
	}
}

// toLua converts decoded JSON as Argo CD does: objects and arrays to tables (arrays from 1).
func toLua(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := l.NewTable()
		for _, item := range v {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]any:
		t := l.NewTable()
		for k, item := range v {
			t.RawSetString(k, toLua(l, item))
		}
		return t
	default:
		check(fmt.Errorf("unexpected JSON value %T", v))
		return lua.LNil
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "gitops-health:", err)
		os.Exit(1)
	}
}
