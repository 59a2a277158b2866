// Two projects: `unit` (pure logic, beside the code, no cluster) and `integration`
// (test/integration, against the real local API server that globalSetup starts or reuses).
import { createDefaultEsmPreset } from 'ts-jest';

const preset = createDefaultEsmPreset({ tsconfig: 'tsconfig.json' });
const common = {
  ...preset,
  testEnvironment: 'node',
  // Sources import siblings as './x.js' (NodeNext); jest resolves them to the .ts files.
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  // The local cluster's state (etcd snapshots, kwok workdirs) and build output are not sources.
  modulePathIgnorePatterns: ['<rootDir>/.cluster/', '<rootDir>/dist/'],
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/.cluster/', '<rootDir>/dist/'],
};

export default {
  projects: [
    {
      ...common,
      displayName: 'unit',
      testMatch: ['<rootDir>/{bridge,operator,client,common}/**/*.test.ts', '<rootDir>/test/docs/*.test.ts'],
    },
    {
      ...common,
      displayName: 'integration',
      testMatch: ['<rootDir>/test/integration/**/*.test.ts'],
      globalSetup: '<rootDir>/test/cluster/jest-global-setup.js',
      globalTeardown: '<rootDir>/test/cluster/jest-global-teardown.js',
      slowTestThreshold: 30,
    },
  ],
  testTimeout: 60_000,
};
