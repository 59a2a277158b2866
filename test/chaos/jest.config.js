// The chaos suite (test/chaos/, `npm run test:chaos`): its own jest configuration, so that
// `npm test` (the root jest.config.js, whose projects match only unit tests and
// test/integration/) never runs it. It needs the local cluster already up with its real node and
// object store (`npm run cluster:up`); it never starts or stops the cluster itself.
import { createDefaultEsmPreset } from 'ts-jest';

const preset = createDefaultEsmPreset({ tsconfig: 'tsconfig.json' });

export default {
  rootDir: '../..',
  ...preset,
  displayName: 'chaos',
  testEnvironment: 'node',
  // Sources import siblings as './x.js' (NodeNext); jest resolves them to the .ts files.
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  modulePathIgnorePatterns: ['<rootDir>/.cluster/', '<rootDir>/dist/'],
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/.cluster/', '<rootDir>/dist/'],
  testMatch: ['<rootDir>/test/chaos/**/*.test.ts'],
  globalSetup: '<rootDir>/test/chaos/global-setup.js',
  // One run at a time: the suite loads the machine on purpose and measures against a deadline.
  maxWorkers: 1,
  testTimeout: 15 * 60_000,
  // Keep-alive connections of the several clients the run drives (API server, store, bridges)
  // outlive its last test by a while; nothing is left running that matters once it is done.
  forceExit: true,
};
