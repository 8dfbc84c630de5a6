package server

import (
	"errors"
	"net"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

// standalonePKI is the standalone mode's certificate set, kept under
// <data-dir>/pki so that the kubeconfig stays valid across restarts.
type standalonePKI struct {
	dir string
}

// File names inside the pki directory.
const (
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	servingCert    = "serving.crt"
	servingKeyFile = "serving.key"
	adminCertFile  = "admin.crt"
	adminKeyFile   = "admin.key"
	adminUserName  = "cached-apiserver-admin"
	mastersGroup   = "system:masters"
	kubeconfigUser = "admin"
)

func (p standalonePKI) path(name string) string { return filepath.Join(p.dir, name) }

// ensure creates the CA, the serving certificate and the admin client
// certificate, unless all of them exist already.
func (p standalonePKI) ensure(hosts []string, ips []net.IP) error {
	if exists(p.path(caCertFile)) && exists(p.path(servingCert)) && exists(p.path(adminCertFile)) {
		return nil
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	ca, err := pki.NewCA("cached-apiserver-ca")
	if err != nil {
		return err
	}
	if err := pki.WriteCertKey(p.path(caCertFile), p.path(caKeyFile), ca.Cert, ca.Key); err != nil {
		return err
	}
	serving, servingKey, err := ca.Sign(pki.Serving("cached-apiserver", hosts, ips))
	if err != nil {
		return err
	}
	if err := pki.WriteCertKey(p.path(servingCert), p.path(servingKeyFile), serving, servingKey); err != nil {
		return err
	}
	admin, adminKey, err := ca.Sign(pki.Client(adminUserName, mastersGroup))
	if err != nil {
		return err
	}
	return pki.WriteCertKey(p.path(adminCertFile), p.path(adminKeyFile), admin, adminKey)
}

// writeKubeconfig writes a kubeconfig that verifies the server against the
// CA and authenticates with the admin client certificate.
func (p standalonePKI) writeKubeconfig(path, serverURL string) error {
	ca, err := os.ReadFile(p.path(caCertFile))
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(p.path(adminCertFile))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.path(adminKeyFile))
	if err != nil {
		return err
	}
	const name = "cached-apiserver"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: ca}
	cfg.AuthInfos[kubeconfigUser] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: kubeconfigUser, Namespace: "default"}
	cfg.CurrentContext = name
	return clientcmd.WriteToFile(*cfg, path)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
