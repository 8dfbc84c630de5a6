// Command kubectl is upstream's kubectl, built from k8s.io/kubectl at the
// version pinned in go.mod, so that tests and developers need nothing
// installed. hack/build-kubectl.sh builds it into bin/.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
